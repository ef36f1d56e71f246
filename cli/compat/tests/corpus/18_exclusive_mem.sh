#!/bin/bash
#SBATCH --exclusive
#SBATCH --mem=0
#SBATCH -N 2
#SBATCH -t 3:00:00

srun ./stream
