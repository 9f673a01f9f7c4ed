/* Writes a large OTF2 archive shaped like a training run, for
 * bench/trace_read.py --streamed (the Python writer is too slow for 10^8
 * events): RANKS ranks, one location each ("MPI Rank r" / "Master thread"),
 * steps of user:step > user:data_load, user:forward, user:backward >
 * MPI_Allreduce (with its MpiCollectiveBegin/End and bytes), user:optimizer,
 * nanosecond ticks: 14 events a step. Each location declares the events
 * written to it, counted as they are written (bench/otf2_count.c counts
 * them again through the library).
 *
 *     otf2_generate ARCHIVE_DIR RANKS STEPS_PER_RANK
 */
#include <otf2/otf2.h>
#include <stdio.h>
#include <stdlib.h>

static OTF2_FlushType pre_flush(void *data, OTF2_FileType type, OTF2_LocationRef location,
                                void *callerData, bool final) {
    (void)data; (void)type; (void)location; (void)callerData; (void)final;
    return OTF2_FLUSH;
}

static OTF2_TimeStamp post_flush(void *data, OTF2_FileType type, OTF2_LocationRef location) {
    (void)data; (void)type; (void)location;
    return 0;
}

static OTF2_FlushCallbacks flush = {.otf2_pre_flush = pre_flush, .otf2_post_flush = post_flush};

enum { STEP, DATA_LOAD, FORWARD, BACKWARD, OPTIMIZER, ALLREDUCE, REGIONS };
static const char *names[REGIONS] = {"user:step", "user:data_load", "user:forward",
                                     "user:backward", "user:optimizer", "MPI_Allreduce"};

#define CHECK(call) do { if ((call) != OTF2_SUCCESS) { \
    fprintf(stderr, "otf2_generate: %s failed\n", #call); return 1; } } while (0)
/* An event record, counted on its location. */
#define EVENT(call) do { CHECK(call); written[r]++; } while (0)

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: otf2_generate ARCHIVE_DIR RANKS STEPS_PER_RANK\n");
        return 2;
    }
    int ranks = atoi(argv[2]);
    long steps = atol(argv[3]);
    OTF2_Archive *archive = OTF2_Archive_Open(argv[1], "traces", OTF2_FILEMODE_WRITE,
                                              1 << 20, 4 << 20, OTF2_SUBSTRATE_POSIX,
                                              OTF2_COMPRESSION_NONE);
    if (!archive) { fprintf(stderr, "otf2_generate: cannot create %s\n", argv[1]); return 1; }
    CHECK(OTF2_Archive_SetFlushCallbacks(archive, &flush, NULL));
    CHECK(OTF2_Archive_SetSerialCollectiveCallbacks(archive));
    CHECK(OTF2_Archive_OpenEvtFiles(archive));
    uint64_t end = 0;
    uint64_t *written = calloc((size_t)ranks, sizeof *written);
    for (int r = 0; r < ranks; r++) {
        OTF2_EvtWriter *w = OTF2_Archive_GetEvtWriter(archive, r);
        uint64_t t = 1000 + (uint64_t)r * 7;
        for (long s = 0; s < steps; s++) {
            EVENT(OTF2_EvtWriter_Enter(w, NULL, t, STEP));
            for (int phase = DATA_LOAD; phase <= OPTIMIZER; phase++) {
                EVENT(OTF2_EvtWriter_Enter(w, NULL, t + 10, phase));
                if (phase == BACKWARD) {
                    EVENT(OTF2_EvtWriter_Enter(w, NULL, t + 100, ALLREDUCE));
                    EVENT(OTF2_EvtWriter_MpiCollectiveBegin(w, NULL, t + 101));
                    EVENT(OTF2_EvtWriter_MpiCollectiveEnd(w, NULL, t + 500,
                                                          OTF2_COLLECTIVE_OP_ALLREDUCE, 0,
                                                          OTF2_UNDEFINED_UINT32, 4 << 20,
                                                          4 << 20));
                    EVENT(OTF2_EvtWriter_Leave(w, NULL, t + 501, ALLREDUCE));
                }
                t += 1000;
                EVENT(OTF2_EvtWriter_Leave(w, NULL, t, phase));
            }
            t += 100;
            EVENT(OTF2_EvtWriter_Leave(w, NULL, t, STEP));
        }
        if (t > end) end = t;
        CHECK(OTF2_Archive_CloseEvtWriter(archive, w));
    }
    CHECK(OTF2_Archive_CloseEvtFiles(archive));

    OTF2_GlobalDefWriter *d = OTF2_Archive_GetGlobalDefWriter(archive);
    CHECK(OTF2_GlobalDefWriter_WriteClockProperties(d, 1000000000, 0, end + 1,
                                                    OTF2_UNDEFINED_TIMESTAMP));
    CHECK(OTF2_GlobalDefWriter_WriteString(d, 0, ""));
    for (int i = 0; i < REGIONS; i++) {
        CHECK(OTF2_GlobalDefWriter_WriteString(d, 1 + i, names[i]));
        CHECK(OTF2_GlobalDefWriter_WriteRegion(
            d, i, 1 + i, 1 + i, 0, i == ALLREDUCE ? OTF2_REGION_ROLE_COLL_ALL2ALL
                                                  : OTF2_REGION_ROLE_FUNCTION,
            i == ALLREDUCE ? OTF2_PARADIGM_MPI : OTF2_PARADIGM_USER, OTF2_REGION_FLAG_NONE,
            0, 0, 0));
    }
    uint32_t next = 1 + REGIONS;
    CHECK(OTF2_GlobalDefWriter_WriteString(d, next, "node"));
    CHECK(OTF2_GlobalDefWriter_WriteString(d, next + 1, "machine"));
    CHECK(OTF2_GlobalDefWriter_WriteString(d, next + 2, "Master thread"));
    CHECK(OTF2_GlobalDefWriter_WriteSystemTreeNode(d, 0, next + 1, next, OTF2_UNDEFINED_SYSTEM_TREE_NODE));
    uint32_t strings = next + 3;
    for (int r = 0; r < ranks; r++) {
        char name[32];
        snprintf(name, sizeof name, "MPI Rank %d", r);
        CHECK(OTF2_GlobalDefWriter_WriteString(d, strings + r, name));
        CHECK(OTF2_GlobalDefWriter_WriteLocationGroup(d, r, strings + r,
                                                      OTF2_LOCATION_GROUP_TYPE_PROCESS, 0,
                                                      OTF2_UNDEFINED_LOCATION_GROUP));
        CHECK(OTF2_GlobalDefWriter_WriteLocation(d, r, next + 2, OTF2_LOCATION_TYPE_CPU_THREAD,
                                                 written[r], r));
    }
    /* MPI_COMM_WORLD: the communicator the collective records name. */
    uint64_t *members = malloc(sizeof *members * (size_t)ranks);
    for (int r = 0; r < ranks; r++) members[r] = (uint64_t)r;
    CHECK(OTF2_GlobalDefWriter_WriteString(d, strings + ranks, "MPI_COMM_WORLD"));
    CHECK(OTF2_GlobalDefWriter_WriteGroup(d, 0, strings + ranks,
                                          OTF2_GROUP_TYPE_COMM_LOCATIONS, OTF2_PARADIGM_MPI,
                                          OTF2_GROUP_FLAG_NONE, (uint32_t)ranks, members));
    CHECK(OTF2_GlobalDefWriter_WriteGroup(d, 1, strings + ranks, OTF2_GROUP_TYPE_COMM_GROUP,
                                          OTF2_PARADIGM_MPI, OTF2_GROUP_FLAG_NONE,
                                          (uint32_t)ranks, members));
    CHECK(OTF2_GlobalDefWriter_WriteComm(d, 0, strings + ranks, 1, OTF2_UNDEFINED_COMM,
                                         OTF2_COMM_FLAG_NONE));
    free(members);
    uint64_t total = 0;
    for (int r = 0; r < ranks; r++) total += written[r];
    free(written);
    printf("%llu events written\n", (unsigned long long)total);
    CHECK(OTF2_Archive_CloseGlobalDefWriter(archive, d));
    CHECK(OTF2_Archive_Close(archive));
    return 0;
}
