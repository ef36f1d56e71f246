#!/bin/bash
#SBATCH --export=ALL,OMP_NUM_THREADS=4,MY_FLAG=on
#SBATCH -N 1

./env_app
