#!/bin/bash
#SBATCH --nodelist=nid[001-004]
#SBATCH --exclude=nid010
#SBATCH --switches=1
#SBATCH -N 4

srun ./latency_test
