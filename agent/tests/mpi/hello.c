/* MPI hello world for the agent's PMI tests and hack/bench-launch.sh: MPI_Init, a
 * barrier, an allreduce of the ranks, MPI_Finalize. With the argument `crash`, the last
 * rank dies (SIGKILL) after MPI_Init while the others wait in the barrier; with `abort`,
 * it calls MPI_Abort. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    int rank, size, sum = 0, len;
    char host[MPI_MAX_PROCESSOR_NAME];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &len);
    if (argc > 1 && rank == size - 1) {
        if (strcmp(argv[1], "crash") == 0) {
            kill(getpid(), SIGKILL);
        }
        if (strcmp(argv[1], "abort") == 0) {
            MPI_Abort(MPI_COMM_WORLD, 7);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Allreduce(&rank, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    printf("hello rank=%d size=%d sum=%d\n", rank, size, sum);
    fflush(stdout);
    MPI_Finalize();
    return 0;
}
