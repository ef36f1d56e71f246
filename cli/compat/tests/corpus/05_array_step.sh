#!/bin/bash
#SBATCH --array=0-15:4
#SBATCH -t 0:30:00
#SBATCH -o chunk_%a.log

./process --chunk $SLURM_ARRAY_TASK_ID
