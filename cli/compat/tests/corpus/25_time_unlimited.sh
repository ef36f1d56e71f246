#!/bin/bash
#SBATCH --time=UNLIMITED
#SBATCH -N 1

./service_like
