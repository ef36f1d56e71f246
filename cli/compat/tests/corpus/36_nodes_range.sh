#!/bin/bash
#SBATCH -N 2-4
#SBATCH -t 1:00:00

srun ./elastic
