#!/bin/bash
#SBATCH -p sensitive
#SBATCH -N 2
#SBATCH -t 4:00:00
#SBATCH -A physics

./process_patient_data
