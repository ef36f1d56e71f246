#!/bin/bash
#SBATCH --time=2-00:00:00
#SBATCH -N 10
#SBATCH -p long

srun ./long_sim
