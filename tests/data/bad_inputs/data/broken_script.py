import torch

def main(:
    pass
