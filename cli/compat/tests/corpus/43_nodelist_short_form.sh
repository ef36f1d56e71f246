#!/bin/bash
#SBATCH -J pinned
#SBATCH -w gpu-[07-08],login1
#SBATCH -x gpu-09
#SBATCH -t 30

srun ./bench
