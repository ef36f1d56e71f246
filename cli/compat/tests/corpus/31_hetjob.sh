#!/bin/bash
#SBATCH -N 1 -J het
#SBATCH hetjob
#SBATCH -N 4 --gres=gpu:4

srun ./coupled : ./gpu_part
