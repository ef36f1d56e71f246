#!/bin/bash
#SBATCH --array=0-99%20
#SBATCH --time=30
#SBATCH --job-name=sweep
#SBATCH --output=sweep_%A_%a.out

python sweep.py --index $SLURM_ARRAY_TASK_ID
