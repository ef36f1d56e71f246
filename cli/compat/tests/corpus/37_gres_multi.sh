#!/bin/bash
#SBATCH --gres=gpu:2,nvme:1
#SBATCH -N 1

./gpu_nvme
