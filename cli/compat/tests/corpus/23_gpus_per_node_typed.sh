#!/bin/bash
#SBATCH --gpus-per-node=a100:4
#SBATCH --nodes=4
#SBATCH --time=08:00:00
#SBATCH --gpu-bind=closest

srun python -m torch.distributed.run train.py
