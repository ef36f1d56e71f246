#!/bin/bash
#SBATCH --parsable
#SBATCH --wait
#SBATCH -N 1
#SBATCH -t 5

./step1
