#!/bin/bash
#SBATCH --nodes=64
#SBATCH --ntasks=128
#SBATCH --ntasks-per-node=4

srun ./a.out
