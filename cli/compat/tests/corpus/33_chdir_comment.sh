#!/bin/bash
#SBATCH --chdir=/scratch/alice/run42
#SBATCH --comment="campaign 7"
#SBATCH -N 1
#SBATCH --no-requeue

./app
