#include <mpi.h>
#include <omp.h>
#include <stdlib.h>
#include <scorep/SCOREP_User.h>
#define N 100000
int main(int argc, char **argv) {
    int provided; MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    static float g[N], o[N];
    for (int step = 0; step < 3; step++) {
        SCOREP_USER_REGION_DEFINE(h_step) SCOREP_USER_REGION_DEFINE(h_fw)
        SCOREP_USER_REGION_BEGIN(h_step, "step", SCOREP_USER_REGION_TYPE_COMMON)
        SCOREP_USER_REGION_BEGIN(h_fw, "forward", SCOREP_USER_REGION_TYPE_COMMON)
        #pragma omp parallel for
        for (int i = 0; i < N; i++) g[i] = g[i] * 0.5f + i;
        SCOREP_USER_REGION_END(h_fw)
        MPI_Allreduce(g, o, N, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        SCOREP_USER_REGION_END(h_step)
    }
    MPI_Finalize();
    return 0;
}
