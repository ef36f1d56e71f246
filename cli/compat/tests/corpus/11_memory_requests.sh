#!/bin/bash
#SBATCH --mem=64G
#SBATCH --mem-per-cpu=4G
#SBATCH -N 1
#SBATCH -t 45

./bigmem_app
