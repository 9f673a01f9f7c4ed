/* The OTF2 event pass of the phase table, in C (traces/fastotf2/__init__.py
 * builds it against Debian's libopen-trace-format2 and calls it with ctypes).
 *
 * fastotf2_definitions (at the end) keeps the global definitions' records
 * for Python to resolve; Python then hands over the locations to read and
 * columns it allocated for every interval the events can hold;
 * fastotf2_read reads each location's local definitions, then its events, location
 * after location, and fills one row per matched Enter/Leave with the same
 * rules as the Python reader (traces/readers/otf2_reader.py):
 * - a Leave closes the innermost open region of its name; when that is not
 *   the innermost one (several threads on one location) it is counted as
 *   overlapping and closed all the same, the others staying open; when no
 *   open region has its name, it closes the innermost (counted as renamed);
 * - a calling context's Enter and Leave (Score-P with unwinding) are its
 *   region's;
 * - an Enter's step and epoch come from its `step`/`epoch` attributes, else
 *   from the enclosing region;
 * - MPI message sizes add up on the innermost open region; a collective's
 *   end gives it its operation and max(sent, received) bytes, a
 *   non-blocking collective's completion the region that requested it.
 * Rows hold what the table keeps where it can (the rank and node of their
 * location, the region's index among those defined), and which regions and
 * operations occur is marked as rows are written: Python then needs no pass
 * over the rows to find them.
 * Times stay in clock ticks: Python converts them.
 * A location that cannot be read to its end keeps the rows read before the
 * fault and is marked in `failed`; the others are read all the same. Calls
 * on different threads (different locations) run in parallel: each opens
 * its own reader, and the library's error reports go to the calling
 * thread's columns.
 */
#include <otf2/otf2.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define NONE INT64_MIN
#define OVERFLOW "more events than the definitions announce"
enum { ATTR_OTHER = 0, ATTR_STEP = 1, ATTR_EPOCH = 2 };

/* Mirrored by traces/fastotf2/__init__.py (_Columns). */
typedef struct {
    int64_t capacity;          /* rows each column holds */
    int64_t *start, *end;      /* ticks */
    int32_t *location;         /* index into the locations given */
    int32_t *rank, *node;      /* the location's, from location_rank/location_node */
    uint32_t *region;          /* index among the regions defined (region_ref);
                                  `regions` for a ref they do not have */
    int32_t *depth;
    int64_t *parent;           /* row of the enclosing interval, -1 at top level */
    int64_t *step, *epoch;     /* NONE when unknown (negative: outside steps) */
    int32_t *collective;       /* OTF2_CollectiveOp, -1 when none */
    int64_t *bytes;            /* NONE when unknown (or negative) */
    int64_t *enter_row;        /* scratch: enter number -> row, enter_capacity long */
    int64_t enter_capacity;
    /* Lookups by definition ref, of the definitions present (their refs
     * sorted, searched by halves): memory follows the archive's
     * definitions, not its largest ref (refs may be sparse). */
    const uint32_t *attribute_ref;
    const uint8_t *attribute_kind; /* ATTR_* of each attribute_ref */
    uint32_t attribute_kinds;
    const uint32_t *context_ref;
    const uint32_t *context_region; /* global region ref of each context_ref */
    uint32_t context_regions;
    const uint32_t *region_ref;     /* the regions defined, their refs sorted */
    uint32_t regions;
    /* Where the refs are dense: each ref's index among them (`regions`
     * where none), region_of_refs long; NULL where sparse (searched). */
    const uint32_t *region_of_ref;
    uint32_t region_of_refs;
    const int32_t *location_rank, *location_node; /* per location given */
    /* Which values the rows hold, so that Python need not look at every
     * row to find them: region indices (regions + 1 long) and collective
     * operations (256 long: OTF2_CollectiveOp is a uint8_t). */
    uint8_t *region_seen, *op_seen;
    /* results */
    int8_t *failed;            /* per location given: 1 when not read to its end */
    int64_t rows, unbalanced, overlapping, unclosed, messages_outside, renamed, overflowed;
    char error[1024];
} Columns;

static __thread Columns *current; /* where this thread's library errors go */

typedef struct {
    uint32_t region;
    int64_t start, enter, parent, step, epoch, bytes;
    int32_t collective;
} Open;

typedef struct {
    uint64_t request;
    int64_t enter;             /* of the region the request was made in */
} Pending;

typedef struct {
    Columns *out;
    int32_t location;
    Open *stack;
    int64_t depth, room, enters;
    Pending *pending;          /* this location's non-blocking collectives in flight */
    int64_t in_flight, pending_room;
} State;

static void fail(Columns *out, const char *fmt, ...) {
    if (out->error[0]) return; /* keep the first reason */
    va_list va;
    va_start(va, fmt);
    vsnprintf(out->error, sizeof out->error, fmt, va);
    va_end(va);
}

/* The library prints its errors to stderr; keep the first as the reason. */
static OTF2_ErrorCode on_error(void *user, const char *file, uint64_t line, const char *function,
                               OTF2_ErrorCode code, const char *fmt, va_list va) {
    Columns *out = current;
    (void)user; (void)file; (void)line; (void)function;
    if (out && !out->error[0]) {
        char detail[768];
        vsnprintf(detail, sizeof detail, fmt ? fmt : "", va);
        snprintf(out->error, sizeof out->error, "%s: %s%s%s", OTF2_Error_GetName(code),
                 OTF2_Error_GetDescription(code), detail[0] ? ": " : "", detail);
    }
    return code;
}

/* Where ``ref`` is in ``refs`` (sorted, ``n`` long), -1 when absent. */
static int64_t find(const uint32_t *refs, uint32_t n, uint32_t ref) {
    uint32_t low = 0, high = n;
    while (low < high) {
        uint32_t mid = low + (high - low) / 2;
        if (refs[mid] < ref) low = mid + 1;
        else high = mid;
    }
    return low < n && refs[low] == ref ? (int64_t)low : -1;
}

/* A region ref's index among the regions defined; `regions` where none. */
static uint32_t region_index(const Columns *out, uint32_t ref) {
    if (out->region_of_ref)
        return ref < out->region_of_refs ? out->region_of_ref[ref] : out->regions;
    int64_t at = find(out->region_ref, out->regions, ref);
    return at < 0 ? out->regions : (uint32_t)at;
}

/* The columns' next rows, faulted in ahead a stretch at a time (Linux 5.14
 * and later; elsewhere a hint refused, nothing more): the kernel then fills
 * a stretch of new pages in one call instead of taking one page fault per
 * page as the rows are written (reading the C-generated 7 M-event archive
 * in one process: 0.95x the CPU, 0.93x the system time, the medians of 12
 * interleaved pairs beside other work). Only the rows about to be
 * written: the capacity counts every event, and events other than Enter
 * and Leave give none. */
#define AHEAD_ROWS 65536

static void populate(void *column, size_t width, int64_t from, int64_t rows) {
#ifdef MADV_POPULATE_WRITE
    static uintptr_t page;
    if (!page) page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)column + (uintptr_t)from * width;
    uintptr_t end = start + (uintptr_t)rows * width;
    start &= ~(page - 1);
    if (end > start) madvise((void *)start, end - start, MADV_POPULATE_WRITE); /* a hint */
#else
    (void)column; (void)width; (void)from; (void)rows;
#endif
}

static void populate_ahead(Columns *out, int64_t from) {
    int64_t rows = out->capacity - from < AHEAD_ROWS ? out->capacity - from : AHEAD_ROWS;
    populate(out->start, sizeof *out->start, from, rows);
    populate(out->end, sizeof *out->end, from, rows);
    populate(out->location, sizeof *out->location, from, rows);
    populate(out->rank, sizeof *out->rank, from, rows);
    populate(out->node, sizeof *out->node, from, rows);
    populate(out->region, sizeof *out->region, from, rows);
    populate(out->depth, sizeof *out->depth, from, rows);
    populate(out->parent, sizeof *out->parent, from, rows);
    populate(out->step, sizeof *out->step, from, rows);
    populate(out->epoch, sizeof *out->epoch, from, rows);
    populate(out->collective, sizeof *out->collective, from, rows);
    populate(out->bytes, sizeof *out->bytes, from, rows);
}

static void set_collective(Columns *out, int64_t row, int32_t op) {
    out->collective[row] = op;
    if (op >= 0) out->op_seen[op & 0xff] = 1;
}

/* The rare paths of enter and leave, kept out of them: what is left of
 * them then holds fewer registers (their instructions a row: docs/tracing.md,
 * "Speed and memory"). */
#define RARE __attribute__((noinline, cold))

RARE static int grow_stack(State *s) {
    int64_t room = s->room ? 2 * s->room : 64;
    Open *grown = realloc(s->stack, room * sizeof *grown);
    if (!grown) { fail(s->out, "out of memory"); return 0; }
    s->stack = grown;
    s->room = room;
    return 1;
}

RARE static OTF2_CallbackCode overflowed(Columns *out) {
    fail(out, OVERFLOW);
    out->overflowed = 1;
    return OTF2_CALLBACK_INTERRUPT;
}

/* An Enter's `step` and `epoch` attributes, where it has them. */
RARE static void step_attributes(const Columns *out, OTF2_AttributeList *attributes, uint32_t n,
                                 int64_t *step, int64_t *epoch) {
    for (uint32_t i = 0; i < n; i++) {
        OTF2_AttributeRef ref;
        OTF2_Type type;
        OTF2_AttributeValue value;
        if (OTF2_AttributeList_GetAttributeByIndex(attributes, i, &ref, &type, &value)
                != OTF2_SUCCESS) continue;
        int64_t at = find(out->attribute_ref, out->attribute_kinds, ref);
        if (at < 0) continue;
        if (out->attribute_kind[at] == ATTR_STEP) *step = value.int64;
        else if (out->attribute_kind[at] == ATTR_EPOCH) *epoch = value.int64;
    }
}

static OTF2_CallbackCode enter(OTF2_LocationRef location, OTF2_TimeStamp time, uint64_t position,
                               void *user, OTF2_AttributeList *attributes, OTF2_RegionRef region) {
    State *s = user;
    Columns *out = s->out;
    (void)location; (void)position;
    if (s->enters >= out->enter_capacity) return overflowed(out);
    if (s->depth == s->room && !grow_stack(s)) return OTF2_CALLBACK_INTERRUPT;
    int64_t step = NONE, epoch = NONE;
    uint32_t n = attributes ? OTF2_AttributeList_GetNumberOfElements(attributes) : 0;
    if (n) step_attributes(out, attributes, n, &step, &epoch);
    Open *top = s->depth ? &s->stack[s->depth - 1] : NULL;
    if (step == NONE && top) { step = top->step; epoch = top->epoch; }
    Open *e = &s->stack[s->depth++];
    e->region = region; e->start = time; e->enter = s->enters++;
    e->parent = top ? top->enter : -1;
    out->enter_row[e->enter] = -1;
    e->step = step; e->epoch = epoch; e->bytes = -1; e->collective = -1;
    return OTF2_CALLBACK_SUCCESS;
}

/* Which open region a Leave closes where it is not the innermost: the
 * innermost of its name (counted as overlapping), else the innermost
 * (counted as renamed); -1 when none is open (counted as unbalanced). */
RARE static int64_t closed_elsewhere(State *s, uint32_t region) {
    Columns *out = s->out;
    int64_t at = s->depth - 1;
    while (at >= 0 && s->stack[at].region != region) at--;
    if (at < 0 && s->depth) {
        /* No open region of that name: close the innermost, as OTF2 says a
         * Leave does (APEX leaves an HPX task under the name it was
         * renamed to). */
        out->renamed++;
        return s->depth - 1;
    }
    if (at < 0) out->unbalanced++;
    else out->overlapping++;
    return at;
}

static OTF2_CallbackCode leave(OTF2_LocationRef location, OTF2_TimeStamp time, uint64_t position,
                               void *user, OTF2_AttributeList *attributes, OTF2_RegionRef region) {
    State *s = user;
    Columns *out = s->out;
    (void)location; (void)position; (void)attributes;
    int64_t at = s->depth - 1;
    if (at < 0 || s->stack[at].region != region) {
        at = closed_elsewhere(s, region);
        if (at < 0) return OTF2_CALLBACK_SUCCESS;
    }
    int64_t row = out->rows;
    if (row >= out->capacity) return overflowed(out);
    out->rows = row + 1;
    if ((row & (AHEAD_ROWS - 1)) == 0) populate_ahead(out, row);
    const Open *e = &s->stack[at];
    out->enter_row[e->enter] = row;
    out->start[row] = e->start;
    out->end[row] = time;
    out->location[row] = s->location;
    out->rank[row] = out->location_rank[s->location];
    out->node[row] = out->location_node[s->location];
    uint32_t index = region_index(out, e->region);
    out->region[row] = index;
    out->region_seen[index] = 1;
    out->depth[row] = (int32_t)at;
    out->parent[row] = e->parent; /* an enter number until all rows are in */
    out->step[row] = e->step < 0 ? NONE : e->step;
    out->epoch[row] = e->epoch < 0 ? NONE : e->epoch;
    set_collective(out, row, e->collective);
    out->bytes[row] = e->bytes < 0 ? NONE : e->bytes;
    /* the innermost, nearly always: nothing above it to move down (a call
     * of memmove per row was a tenth of this function's instructions) */
    if (at != s->depth - 1)
        memmove(&s->stack[at], &s->stack[at + 1], (s->depth - at - 1) * sizeof *e);
    s->depth--;
    return OTF2_CALLBACK_SUCCESS;
}

/* With unwinding (SCOREP_ENABLE_UNWINDING, sampling), Score-P records a
 * region's Enter and Leave as those of its calling context: the same
 * intervals, each context standing for its region. */
static int context_region(State *s, OTF2_CallingContextRef context, uint32_t *region) {
    int64_t at = find(s->out->context_ref, s->out->context_regions, context);
    if (at < 0) {
        s->out->unbalanced++; /* a context the definitions do not have */
        return 0;
    }
    *region = s->out->context_region[at];
    return 1;
}

static OTF2_CallbackCode context_enter(OTF2_LocationRef location, OTF2_TimeStamp time,
                                       uint64_t position, void *user,
                                       OTF2_AttributeList *attributes,
                                       OTF2_CallingContextRef context, uint32_t unwound) {
    uint32_t region;
    (void)unwound;
    if (!context_region(user, context, &region)) return OTF2_CALLBACK_SUCCESS;
    return enter(location, time, position, user, attributes, region);
}

static OTF2_CallbackCode context_leave(OTF2_LocationRef location, OTF2_TimeStamp time,
                                       uint64_t position, void *user,
                                       OTF2_AttributeList *attributes,
                                       OTF2_CallingContextRef context) {
    uint32_t region;
    if (!context_region(user, context, &region)) return OTF2_CALLBACK_SUCCESS;
    return leave(location, time, position, user, attributes, region);
}

static void add_bytes(State *s, uint64_t length) {
    if (!s->depth) { s->out->messages_outside++; return; }
    Open *top = &s->stack[s->depth - 1];
    top->bytes = (top->bytes < 0 ? 0 : top->bytes) + (int64_t)length;
}

static OTF2_CallbackCode mpi_send(OTF2_LocationRef l, OTF2_TimeStamp t, uint64_t p, void *user,
                                  OTF2_AttributeList *a, uint32_t peer, OTF2_CommRef comm,
                                  uint32_t tag, uint64_t length) {
    (void)l; (void)t; (void)p; (void)a; (void)peer; (void)comm; (void)tag;
    add_bytes(user, length);
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode mpi_isend(OTF2_LocationRef l, OTF2_TimeStamp t, uint64_t p, void *user,
                                   OTF2_AttributeList *a, uint32_t peer, OTF2_CommRef comm,
                                   uint32_t tag, uint64_t length, uint64_t request) {
    (void)request;
    return mpi_send(l, t, p, user, a, peer, comm, tag, length);
}

static OTF2_CallbackCode collective_end(OTF2_LocationRef l, OTF2_TimeStamp t, uint64_t p,
                                        void *user, OTF2_AttributeList *a, OTF2_CollectiveOp op,
                                        OTF2_CommRef comm, uint32_t root, uint64_t sent,
                                        uint64_t received) {
    State *s = user;
    (void)l; (void)t; (void)p; (void)a; (void)comm; (void)root;
    if (s->depth) {
        Open *top = &s->stack[s->depth - 1];
        top->collective = op;
        top->bytes = (int64_t)(sent > received ? sent : received);
    } else {
        s->out->messages_outside++;
    }
    return OTF2_CALLBACK_SUCCESS;
}

/* A non-blocking collective (MPI_Iallreduce ...) is requested in one region
 * and completed in another (MPI_Wait ...): its operation and bytes go to the
 * region that requested it, as a blocking collective's go to its own. */
static OTF2_CallbackCode collective_request(OTF2_LocationRef l, OTF2_TimeStamp t, uint64_t p,
                                            void *user, OTF2_AttributeList *a, uint64_t request) {
    State *s = user;
    (void)l; (void)t; (void)p; (void)a;
    if (!s->depth) { s->out->messages_outside++; return OTF2_CALLBACK_SUCCESS; }
    if (s->in_flight == s->pending_room) {
        s->pending_room = s->pending_room ? 2 * s->pending_room : 16;
        Pending *grown = realloc(s->pending, s->pending_room * sizeof *grown);
        if (!grown) { fail(s->out, "out of memory"); return OTF2_CALLBACK_INTERRUPT; }
        s->pending = grown;
    }
    s->pending[s->in_flight++] = (Pending){request, s->stack[s->depth - 1].enter};
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode collective_complete(OTF2_LocationRef l, OTF2_TimeStamp t, uint64_t p,
                                             void *user, OTF2_AttributeList *a,
                                             OTF2_CollectiveOp op, OTF2_CommRef comm,
                                             uint32_t root, uint64_t sent, uint64_t received,
                                             uint64_t request) {
    State *s = user;
    Columns *out = s->out;
    int64_t at = s->in_flight - 1;
    while (at >= 0 && s->pending[at].request != request) at--;
    if (at < 0) /* no request seen: where it completes, as a blocking one */
        return collective_end(l, t, p, user, a, op, comm, root, sent, received);
    int64_t enter = s->pending[at].enter;
    s->pending[at] = s->pending[--s->in_flight];
    int64_t nbytes = (int64_t)(sent > received ? sent : received);
    int64_t row = out->enter_row[enter];
    if (row >= 0) { /* the requesting region has ended (the usual case) */
        set_collective(out, row, op);
        out->bytes[row] = nbytes < 0 ? NONE : nbytes;
        return OTF2_CALLBACK_SUCCESS;
    }
    for (int64_t i = s->depth - 1; i >= 0; i--)
        if (s->stack[i].enter == enter) {
            s->stack[i].collective = op;
            s->stack[i].bytes = nbytes;
        }
    return OTF2_CALLBACK_SUCCESS;
}

/* Whether this location has no definitions file of its own, in an archive
 * laid out a file per location (the POSIX substrate's <archive>/<ref>.evt):
 * the library's reader of them would still take a buffer of the archive's
 * definition chunk size, zeroed and kept until the archive closes, to read
 * nothing (4 MiB a location in the bench's archive: docs/tracing.md, "Speed
 * and memory"). Elsewhere (another substrate, or the file present) they are
 * read. */
static int no_local_definitions(const char *anchor, OTF2_LocationRef ref) {
    char path[4096];
    size_t len = strlen(anchor);
    struct stat st;
    if (len < 5 || strcmp(anchor + len - 5, ".otf2") != 0 || len + 32 > sizeof path) return 0;
    snprintf(path, sizeof path, "%.*s/%llu.def", (int)(len - 5), anchor, (unsigned long long)ref);
    if (stat(path, &st) == 0) return 0;
    snprintf(path, sizeof path, "%.*s/%llu.evt", (int)(len - 5), anchor, (unsigned long long)ref);
    return stat(path, &st) == 0;
}

#define CHECK(call, what) do { OTF2_ErrorCode code_ = (call); if (code_ != OTF2_SUCCESS) { \
    fail(out, "%s: %s", what, OTF2_Error_GetDescription(code_)); goto done; } } while (0)

/* Reads one location's events; on a fault the rows read so far stay, the
 * regions still open count as unclosed and the location is marked failed. */
static void read_location(OTF2_Reader *reader, OTF2_EvtReaderCallbacks *callbacks,
                          OTF2_LocationRef ref, int32_t index, State *s) {
    Columns *out = s->out;
    uint64_t events = 0;
    s->location = index;
    s->depth = 0;
    s->in_flight = 0;
    OTF2_EvtReader *evt = OTF2_Reader_GetEvtReader(reader, ref);
    if (!evt) {
        fail(out, "location %llu: cannot open its events", (unsigned long long)ref);
        out->failed[index] = 1;
        return;
    }
    OTF2_ErrorCode code = OTF2_Reader_RegisterEvtCallbacks(reader, evt, callbacks, s);
    if (code == OTF2_SUCCESS) code = OTF2_Reader_ReadAllLocalEvents(reader, evt, &events);
    OTF2_Reader_CloseEvtReader(reader, evt);
    out->unclosed += s->depth;
    if (code != OTF2_SUCCESS) {
        fail(out, "location %llu: %s", (unsigned long long)ref, OTF2_Error_GetDescription(code));
        out->failed[index] = 1;
    }
}

/* 0 when the archive could be opened (locations may still have failed);
 * -1 otherwise, or when the columns overflowed; out->error says why. */
int fastotf2_read(const char *anchor, const uint64_t *locations, int32_t n_locations,
                  Columns *out) {
    out->rows = out->unbalanced = out->overlapping = out->unclosed = 0;
    out->messages_outside = out->renamed = out->overflowed = 0;
    out->error[0] = 0;
    current = out;
    OTF2_Error_RegisterCallback(on_error, NULL);
    State state = {.out = out};
    OTF2_EvtReaderCallbacks *callbacks = NULL;
    int status = -1;
    OTF2_Reader *reader = OTF2_Reader_Open(anchor);
    if (!reader) { fail(out, "cannot open the archive"); goto done; }
    CHECK(OTF2_Reader_SetSerialCollectiveCallbacks(reader), "cannot set up the reader");
    for (int32_t i = 0; i < n_locations; i++)
        CHECK(OTF2_Reader_SelectLocation(reader, locations[i]), "cannot select a location");
    /* As the library's own readers do: a missing local definition or event
     * file is not an error here (the reads below say what is missing). */
    int def_files = OTF2_Reader_OpenDefFiles(reader) == OTF2_SUCCESS;
    OTF2_Reader_OpenEvtFiles(reader);
    out->error[0] = 0;
    if (def_files) {
        for (int32_t i = 0; i < n_locations; i++) {
            if (no_local_definitions(anchor, locations[i])) continue;
            OTF2_DefReader *defs = OTF2_Reader_GetDefReader(reader, locations[i]);
            if (!defs) continue;
            uint64_t read = 0;
            if (OTF2_Reader_ReadAllLocalDefinitions(reader, defs, &read) != OTF2_SUCCESS) {
                fail(out, "location %llu: cannot read its local definitions",
                     (unsigned long long)locations[i]);
                out->failed[i] = 1;
            }
            OTF2_Reader_CloseDefReader(reader, defs);
        }
        OTF2_Reader_CloseDefFiles(reader);
    }
    callbacks = OTF2_EvtReaderCallbacks_New();
    OTF2_EvtReaderCallbacks_SetEnterCallback(callbacks, enter);
    OTF2_EvtReaderCallbacks_SetLeaveCallback(callbacks, leave);
    OTF2_EvtReaderCallbacks_SetCallingContextEnterCallback(callbacks, context_enter);
    OTF2_EvtReaderCallbacks_SetCallingContextLeaveCallback(callbacks, context_leave);
    OTF2_EvtReaderCallbacks_SetMpiSendCallback(callbacks, mpi_send);
    OTF2_EvtReaderCallbacks_SetMpiRecvCallback(callbacks, mpi_send);
    OTF2_EvtReaderCallbacks_SetMpiIsendCallback(callbacks, mpi_isend);
    OTF2_EvtReaderCallbacks_SetMpiIrecvCallback(callbacks, mpi_isend);
    OTF2_EvtReaderCallbacks_SetMpiCollectiveEndCallback(callbacks, collective_end);
    OTF2_EvtReaderCallbacks_SetNonBlockingCollectiveRequestCallback(callbacks,
                                                                    collective_request);
    OTF2_EvtReaderCallbacks_SetNonBlockingCollectiveCompleteCallback(callbacks,
                                                                     collective_complete);
    for (int32_t i = 0; i < n_locations; i++) {
        if (!out->failed[i]) read_location(reader, callbacks, locations[i], i, &state);
        if (out->overflowed) goto done;
    }
    /* Parents: enter numbers -> rows (an unclosed parent has none). */
    for (int64_t row = 0; row < out->rows; row++)
        if (out->parent[row] >= 0) out->parent[row] = out->enter_row[out->parent[row]];
    status = 0;
done:
    if (callbacks) OTF2_EvtReaderCallbacks_Delete(callbacks);
    if (reader) OTF2_Reader_Close(reader);
    free(state.stack);
    free(state.pending);
    current = NULL;
    return status;
}

/* ---- The global definitions, for Python to read without the `otf2`
 * bindings (traces/readers/otf2_reader.py: _fast_definitions). Each kind's
 * records are kept as they come, in rows of uint64 (refs as the archive
 * gives them, the last field each record's place in the file), the strings
 * in one blob: Python resolves the references and falls back on the
 * bindings wherever they do not resolve, so that a broken archive is
 * refused in the bindings' words. */

enum { DEF_STRING, DEF_CLOCK, DEF_NODE, DEF_GROUP, DEF_LOCATION, DEF_REGION, DEF_ATTRIBUTE,
       DEF_CONTEXT, DEF_KINDS };
static const int def_width[DEF_KINDS] = {4, 4, 5, 6, 6, 6, 4, 5};

typedef struct {
    uint64_t *rows;            /* n x def_width[kind] */
    int64_t n, room;
} DefTable;

/* Mirrored by traces/fastotf2/__init__.py (_Definitions). */
typedef struct {
    DefTable table[DEF_KINDS];
    char *blob;                /* the strings, each followed by a NUL */
    int64_t blob_len, blob_room;
    uint64_t seq;              /* records so far */
    int failed;                /* out of memory */
} Definitions;

static OTF2_CallbackCode keep(Definitions *d, int kind, const uint64_t *fields) {
    DefTable *t = &d->table[kind];
    int w = def_width[kind];
    if (t->n == t->room) {
        int64_t room = t->room ? 2 * t->room : 64;
        uint64_t *grown = realloc(t->rows, room * w * sizeof *grown);
        if (!grown) { d->failed = 1; return OTF2_CALLBACK_INTERRUPT; }
        t->rows = grown;
        t->room = room;
    }
    memcpy(&t->rows[t->n * w], fields, (w - 1) * sizeof *fields);
    t->rows[t->n * w + w - 1] = d->seq++;
    t->n++;
    return OTF2_CALLBACK_SUCCESS;
}

static OTF2_CallbackCode def_string(void *user, OTF2_StringRef self, const char *string) {
    Definitions *d = user;
    int64_t len = string ? (int64_t)strlen(string) : 0;
    if (d->blob_len + len + 1 > d->blob_room) {
        int64_t room = d->blob_room ? 2 * d->blob_room : 4096;
        while (room < d->blob_len + len + 1) room *= 2;
        char *grown = realloc(d->blob, room);
        if (!grown) { d->failed = 1; return OTF2_CALLBACK_INTERRUPT; }
        d->blob = grown;
        d->blob_room = room;
    }
    if (len) memcpy(d->blob + d->blob_len, string, len);
    d->blob[d->blob_len + len] = 0;
    uint64_t fields[] = {self, (uint64_t)d->blob_len, (uint64_t)len};
    d->blob_len += len + 1;
    return keep(d, DEF_STRING, fields);
}

static OTF2_CallbackCode def_clock(void *user, uint64_t resolution, uint64_t offset,
                                   uint64_t length, uint64_t realtime) {
    uint64_t fields[] = {resolution, offset, realtime};
    (void)length;
    return keep(user, DEF_CLOCK, fields);
}

static OTF2_CallbackCode def_node(void *user, OTF2_SystemTreeNodeRef self, OTF2_StringRef name,
                                  OTF2_StringRef class_name, OTF2_SystemTreeNodeRef parent) {
    uint64_t fields[] = {self, name, class_name, parent};
    return keep(user, DEF_NODE, fields);
}

static OTF2_CallbackCode def_group(void *user, OTF2_LocationGroupRef self, OTF2_StringRef name,
                                   OTF2_LocationGroupType type, OTF2_SystemTreeNodeRef parent,
                                   OTF2_LocationGroupRef creator) {
    uint64_t fields[] = {self, name, type, parent, creator};
    return keep(user, DEF_GROUP, fields);
}

static OTF2_CallbackCode def_location(void *user, OTF2_LocationRef self, OTF2_StringRef name,
                                      OTF2_LocationType type, uint64_t events,
                                      OTF2_LocationGroupRef group) {
    uint64_t fields[] = {self, name, type, events, group};
    return keep(user, DEF_LOCATION, fields);
}

static OTF2_CallbackCode def_region(void *user, OTF2_RegionRef self, OTF2_StringRef name,
                                    OTF2_StringRef canonical, OTF2_StringRef description,
                                    OTF2_RegionRole role, OTF2_Paradigm paradigm,
                                    OTF2_RegionFlag flags, OTF2_StringRef file, uint32_t begin,
                                    uint32_t end) {
    uint64_t fields[] = {self, name, canonical, description, file};
    (void)role; (void)paradigm; (void)flags; (void)begin; (void)end;
    return keep(user, DEF_REGION, fields);
}

static OTF2_CallbackCode def_attribute(void *user, OTF2_AttributeRef self, OTF2_StringRef name,
                                       OTF2_StringRef description, OTF2_Type type) {
    uint64_t fields[] = {self, name, description};
    (void)type;
    return keep(user, DEF_ATTRIBUTE, fields);
}

static OTF2_CallbackCode def_context(void *user, OTF2_CallingContextRef self,
                                     OTF2_RegionRef region, OTF2_SourceCodeLocationRef where,
                                     OTF2_CallingContextRef parent) {
    uint64_t fields[] = {self, region, where, parent};
    return keep(user, DEF_CONTEXT, fields);
}

void fastotf2_definitions_free(Definitions *d) {
    for (int k = 0; k < DEF_KINDS; k++) free(d->table[k].rows);
    free(d->blob);
    memset(d, 0, sizeof *d);
}

/* 0 when the global definitions were read whole; -1 otherwise (the
 * library's report went to the standard error: Python then reads them
 * through the bindings, which refuse the archive in their words). */
int fastotf2_definitions(const char *anchor, Definitions *d) {
    memset(d, 0, sizeof *d);
    int status = -1;
    OTF2_GlobalDefReaderCallbacks *callbacks = NULL;
    OTF2_GlobalDefReader *defs = NULL;
    OTF2_Reader *reader = OTF2_Reader_Open(anchor);
    if (!reader) return -1;
    if (OTF2_Reader_SetSerialCollectiveCallbacks(reader) != OTF2_SUCCESS) goto done;
    defs = OTF2_Reader_GetGlobalDefReader(reader);
    callbacks = OTF2_GlobalDefReaderCallbacks_New();
    if (!defs || !callbacks) goto done;
    OTF2_GlobalDefReaderCallbacks_SetStringCallback(callbacks, def_string);
    OTF2_GlobalDefReaderCallbacks_SetClockPropertiesCallback(callbacks, def_clock);
    OTF2_GlobalDefReaderCallbacks_SetSystemTreeNodeCallback(callbacks, def_node);
    OTF2_GlobalDefReaderCallbacks_SetLocationGroupCallback(callbacks, def_group);
    OTF2_GlobalDefReaderCallbacks_SetLocationCallback(callbacks, def_location);
    OTF2_GlobalDefReaderCallbacks_SetRegionCallback(callbacks, def_region);
    OTF2_GlobalDefReaderCallbacks_SetAttributeCallback(callbacks, def_attribute);
    OTF2_GlobalDefReaderCallbacks_SetCallingContextCallback(callbacks, def_context);
    if (OTF2_Reader_RegisterGlobalDefCallbacks(reader, defs, callbacks, d) != OTF2_SUCCESS)
        goto done;
    uint64_t read = 0;
    if (OTF2_Reader_ReadAllGlobalDefinitions(reader, defs, &read) == OTF2_SUCCESS && !d->failed)
        status = 0;
done:
    if (callbacks) OTF2_GlobalDefReaderCallbacks_Delete(callbacks);
    if (defs) OTF2_Reader_CloseGlobalDefReader(reader, defs);
    OTF2_Reader_Close(reader);
    if (status != 0) fastotf2_definitions_free(d);
    return status;
}
