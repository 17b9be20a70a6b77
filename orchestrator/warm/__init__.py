"""Warm groups: worker groups kept up to run job after job, a runtime of its own that sweeps and pools share.

- desk: the small actor where a group and its clients meet (a plain class; typed events).
- worker: the group's side, every rank running the jobs its desk hands out.
- client: a job's side, claiming a desk and relaying the group's rows and reports.
- driver: starting groups (one TorchTrainer each) and their desks.
- pool: one group kept on a running cluster for launches that join it.
"""
