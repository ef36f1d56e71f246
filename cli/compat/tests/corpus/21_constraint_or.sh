#!/bin/bash
#SBATCH --constraint="[a100|h100]"
#SBATCH --gres=gpu:8
#SBATCH -N 2

srun python train.py
