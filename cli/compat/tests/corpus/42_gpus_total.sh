#!/bin/bash
#SBATCH --gpus=16
#SBATCH --nodes=4
#SBATCH --cpus-per-gpu=16
#SBATCH --mem-per-gpu=64G

srun python train.py
