#!/bin/bash
#SBATCH --job-name="my quoted job"
#SBATCH --comment='run #3 of the campaign'
#SBATCH --output="/scratch/alice/out dir/%j.out"
#SBATCH -N 2

srun ./app
