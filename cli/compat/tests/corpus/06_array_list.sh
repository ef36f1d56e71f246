#!/bin/bash
#SBATCH -a 1,3,5-7
#SBATCH -N 1

./rerun_failed.sh $SLURM_ARRAY_TASK_ID
