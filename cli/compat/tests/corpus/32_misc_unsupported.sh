#!/bin/bash
#SBATCH --licenses=matlab:1
#SBATCH --reservation=maint
#SBATCH --begin=now+1hour
#SBATCH --nice=100
#SBATCH --profile=task
#SBATCH -N 1

matlab -batch run
