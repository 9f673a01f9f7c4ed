#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <scorep/SCOREP_User.h>
/* A training-loop shaped MPI program: phases as user regions, a background
 * thread that all-reduces (as Horovod's does), non-blocking collectives. */
#define N 4096
static float grad[N], out[N];
static void *background(void *arg) {
    (void)arg;
    for (int i = 0; i < 5; i++) MPI_Allreduce(grad, out, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    return NULL;
}
int main(int argc, char **argv) {
    int provided, rank, size;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Bcast(grad, N, MPI_FLOAT, 0, MPI_COMM_WORLD);
    pthread_t t;
    pthread_create(&t, NULL, background, NULL);
    for (int step = 0; step < 5; step++) {
        SCOREP_USER_REGION_DEFINE(h_step) SCOREP_USER_REGION_DEFINE(h_fw) SCOREP_USER_REGION_DEFINE(h_bw) SCOREP_USER_REGION_DEFINE(h_opt)
        SCOREP_USER_REGION_BEGIN(h_step, "step", SCOREP_USER_REGION_TYPE_COMMON)
        SCOREP_USER_REGION_BEGIN(h_fw, "forward", SCOREP_USER_REGION_TYPE_COMMON)
        float *a = malloc(sizeof(float) * N * size), *b = malloc(sizeof(float) * N * size);
        MPI_Alltoall(a, N, MPI_FLOAT, b, N, MPI_FLOAT, MPI_COMM_WORLD);
        SCOREP_USER_REGION_END(h_fw)
        SCOREP_USER_REGION_BEGIN(h_bw, "backward", SCOREP_USER_REGION_TYPE_COMMON)
        MPI_Request req;
        MPI_Iallreduce(MPI_IN_PLACE, a, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Reduce_scatter_block(a, b, N / size, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        SCOREP_USER_REGION_END(h_bw)
        SCOREP_USER_REGION_BEGIN(h_opt, "optimizer", SCOREP_USER_REGION_TYPE_COMMON)
        MPI_Allgather(a, N / size, MPI_FLOAT, b, N / size, MPI_FLOAT, MPI_COMM_WORLD);
        SCOREP_USER_REGION_END(h_opt)
        SCOREP_USER_REGION_END(h_step)
        free(a); free(b);
    }
    pthread_join(t, NULL);
    MPI_Finalize();
    return 0;
}
