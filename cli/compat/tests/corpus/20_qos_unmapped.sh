#!/bin/bash
#SBATCH --qos=premium
#SBATCH -N 1

./quick
