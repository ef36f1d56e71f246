#!/bin/bash
#SBATCH --qos=high
#SBATCH -N 32
#SBATCH -t 1-00:00:00
#SBATCH -p long

srun ./climate_model
