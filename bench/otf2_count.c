/* The floor of reading an OTF2 archive: the OTF2 library reads every event
 * record of every location and only counts them (no callback does any
 * work), as bench/trace_read.py's baseline for the phase table, and an
 * independent count of the events an archive holds (its definitions only
 * declare them).
 *
 *     otf2_count ANCHOR      -> "<events> events <cpu seconds> s" on stdout
 *
 * The CPU time is of the reading alone (after the process started), as the
 * bench times the converter's reading (after its imports).
 */
#include <otf2/otf2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    OTF2_Reader *reader;
    OTF2_LocationRef *refs;
    uint64_t n, room;
} Locations;

static OTF2_CallbackCode location(void *user, OTF2_LocationRef ref, OTF2_StringRef name,
                                  OTF2_LocationType type, uint64_t events,
                                  OTF2_LocationGroupRef group) {
    (void)name; (void)type; (void)events; (void)group;
    Locations *all = user;
    if (all->n == all->room) {
        all->room = all->room ? 2 * all->room : 64;
        all->refs = realloc(all->refs, all->room * sizeof *all->refs);
        if (!all->refs) return OTF2_CALLBACK_ERROR;
    }
    all->refs[all->n++] = ref;
    return OTF2_Reader_SelectLocation(all->reader, ref) == OTF2_SUCCESS ? OTF2_CALLBACK_SUCCESS
                                                                       : OTF2_CALLBACK_ERROR;
}

/* A missing local definition file is no error here (the generator writes
 * none): the library's reports are not printed. */
static OTF2_ErrorCode quiet(void *user, const char *file, uint64_t line, const char *function,
                            OTF2_ErrorCode code, const char *format, va_list args) {
    (void)user; (void)file; (void)line; (void)function; (void)format; (void)args;
    return code;
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: otf2_count ANCHOR\n");
        return 2;
    }
    OTF2_Error_RegisterCallback(quiet, NULL);
    double started = cpu_seconds();
    OTF2_Reader *reader = OTF2_Reader_Open(argv[1]);
    if (!reader) { fprintf(stderr, "otf2_count: cannot open %s\n", argv[1]); return 1; }
    OTF2_Reader_SetSerialCollectiveCallbacks(reader);
    OTF2_GlobalDefReader *defs = OTF2_Reader_GetGlobalDefReader(reader);
    OTF2_GlobalDefReaderCallbacks *callbacks = OTF2_GlobalDefReaderCallbacks_New();
    OTF2_GlobalDefReaderCallbacks_SetLocationCallback(callbacks, location);
    Locations all = {.reader = reader};
    OTF2_Reader_RegisterGlobalDefCallbacks(reader, defs, callbacks, &all);
    uint64_t definitions = 0, events = 0;
    OTF2_Reader_ReadAllGlobalDefinitions(reader, defs, &definitions);
    OTF2_GlobalDefReaderCallbacks_Delete(callbacks);
    OTF2_Reader_CloseGlobalDefReader(reader, defs);
    /* as the converter does: each location's local definitions (its id
     * mappings), then its events, location after location */
    int def_files = OTF2_Reader_OpenDefFiles(reader) == OTF2_SUCCESS;
    OTF2_Reader_OpenEvtFiles(reader);
    for (uint64_t i = 0; i < all.n; i++) {
        if (def_files) {
            OTF2_DefReader *local = OTF2_Reader_GetDefReader(reader, all.refs[i]);
            if (local) {
                uint64_t read = 0;
                OTF2_Reader_ReadAllLocalDefinitions(reader, local, &read);
                OTF2_Reader_CloseDefReader(reader, local);
            }
        }
        OTF2_EvtReader *evt = OTF2_Reader_GetEvtReader(reader, all.refs[i]);
        if (!evt) { fprintf(stderr, "otf2_count: location %llu has no events\n",
                            (unsigned long long)all.refs[i]); return 1; }
        uint64_t read = 0;
        if (OTF2_Reader_ReadAllLocalEvents(reader, evt, &read) != OTF2_SUCCESS) {
            fprintf(stderr, "otf2_count: reading location %llu failed\n",
                    (unsigned long long)all.refs[i]);
            return 1;
        }
        events += read;
        OTF2_Reader_CloseEvtReader(reader, evt);
    }
    if (def_files) OTF2_Reader_CloseDefFiles(reader);
    OTF2_Reader_CloseEvtFiles(reader);
    OTF2_Reader_Close(reader);
    free(all.refs);
    printf("%llu events %.3f s\n", (unsigned long long)events, cpu_seconds() - started);
    return 0;
}
