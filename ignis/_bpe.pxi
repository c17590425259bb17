# Byte-level BPE merge loop of ignis.tokenizer (included into ignis/_core.pyx).
#
# Python splits text into pre-tokens; this turns each pre-token into ids: UTF-8 bytes -> byte ids,
# then merges by rank (lowest rank first, leftmost first on ties: Hugging Face tokenizers' order),
# with a per-word cache. The pure-Python twin is ignis.tokenizer.bpe.bpe_word_ref.

from cpython.unicode cimport PyUnicode_AsUTF8AndSize
from libc.stdint cimport int32_t, uint32_t, uint64_t
from libc.stdlib cimport malloc, free, realloc

cdef enum:
    # Words up to this many bytes merge with a quadratic scan (fast for short words); longer ones
    # use a heap so 1 MB of one repeated letter stays O(n log n).
    _BPE_SCAN_MAX = 48
    # Longer pre-tokens are not cached: they rarely repeat and would pin memory.
    _BPE_CACHE_MAX_WORD = 256


cdef inline uint64_t _bpe_key(int32_t a, int32_t b) noexcept nogil:
    return (<uint64_t><uint32_t>a << 32) | <uint64_t><uint32_t>b


cdef inline uint64_t _bpe_hash(uint64_t k) noexcept nogil:
    # splitmix64 finaliser: ids are small, consecutive integers, so mix them before masking.
    k ^= k >> 30
    k *= 0xbf58476d1ce4e5b9ULL
    k ^= k >> 27
    k *= 0x94d049bb133111ebULL
    k ^= k >> 31
    return k


cdef struct _BpeSlot:
    uint64_t key
    int32_t rank      # -1 marks an empty slot
    int32_t new_id


cdef struct _BpeHeapItem:
    int32_t rank
    int32_t pos
    int32_t left
    int32_t right


cdef inline bint _heap_less(_BpeHeapItem *a, _BpeHeapItem *b) noexcept nogil:
    return a.rank < b.rank or (a.rank == b.rank and a.pos < b.pos)


cdef class BPEMerger:
    """Merge table of one byte-level BPE vocabulary; encodes pre-tokens to ids."""

    cdef _BpeSlot *slots
    cdef uint64_t mask
    cdef int32_t byte_ids[256]
    cdef public Py_ssize_t n_merges
    cdef public Py_ssize_t cache_limit

    def __cinit__(self):
        self.slots = NULL

    def __init__(self, byte_ids, merges=None, Py_ssize_t cache_limit=1 << 17, *, columns=None):
        """byte_ids: 256 token ids of the single-byte tokens. merges: (left_id, right_id, new_id)
        in rank order; a later duplicate pair overrides an earlier one, as in tokenizers.
        columns: instead of merges, the same as three int32 buffers (left, right, new) of equal
        length, read without making a Python object per merge (a cached tokenizer's tables)."""
        cdef Py_ssize_t i, n
        cdef const int32_t[::1] left
        cdef const int32_t[::1] right
        cdef const int32_t[::1] new
        if (merges is None) == (columns is None):
            raise ValueError("give merges or columns, not both")
        if columns is not None:
            left, right, new = columns
            n = left.shape[0]
            if right.shape[0] != n or new.shape[0] != n:
                raise ValueError("the merge columns differ in length")
        else:
            n = len(merges)
        if len(byte_ids) != 256:
            raise ValueError("byte_ids must hold 256 token ids")
        for i in range(256):
            self.byte_ids[i] = byte_ids[i]
        self._alloc(n)
        self.cache_limit = cache_limit
        cdef int32_t a, b, c
        if columns is not None:
            for i in range(n):
                self._insert(i, left[i], right[i], new[i])
        else:
            for i in range(n):
                a, b, c = merges[i]
                self._insert(i, a, b, c)

    cdef _alloc(self, Py_ssize_t n):
        cdef uint64_t cap = 16, h
        while cap < <uint64_t>(2 * n + 16):
            cap <<= 1
        self.slots = <_BpeSlot *>malloc(cap * sizeof(_BpeSlot))
        if self.slots == NULL:
            raise MemoryError()
        for h in range(cap):
            self.slots[h].rank = -1
        self.mask = cap - 1
        self.n_merges = n

    cdef inline void _insert(self, Py_ssize_t i, int32_t a, int32_t b, int32_t c) noexcept nogil:
        cdef uint64_t key = _bpe_key(a, b)
        cdef uint64_t h = _bpe_hash(key) & self.mask
        while self.slots[h].rank != -1 and self.slots[h].key != key:
            h = (h + 1) & self.mask
        self.slots[h].key = key
        self.slots[h].rank = <int32_t>i
        self.slots[h].new_id = c

    def __dealloc__(self):
        if self.slots != NULL:
            free(self.slots)

    cdef inline _BpeSlot *_find(self, int32_t a, int32_t b) noexcept nogil:
        cdef uint64_t key = _bpe_key(a, b)
        cdef uint64_t h = _bpe_hash(key) & self.mask
        while self.slots[h].rank != -1:
            if self.slots[h].key == key:
                return &self.slots[h]
            h = (h + 1) & self.mask
        return NULL

    cdef Py_ssize_t _merge_scan(self, int32_t *ids, Py_ssize_t n) noexcept nogil:
        cdef Py_ssize_t i, best_i
        cdef int32_t best_rank, best_new
        cdef _BpeSlot *s
        while n > 1:
            best_rank = 0x7fffffff
            best_i = -1
            for i in range(n - 1):
                s = self._find(ids[i], ids[i + 1])
                if s != NULL and s.rank < best_rank:
                    best_rank = s.rank
                    best_i = i
                    best_new = s.new_id
            if best_i < 0:
                break
            ids[best_i] = best_new
            for i in range(best_i + 1, n - 1):
                ids[i] = ids[i + 1]
            n -= 1
        return n

    cdef Py_ssize_t _merge_heap(self, int32_t *ids, Py_ssize_t n) except -1 nogil:
        # Symbols form a linked list over their starting positions; a heap holds candidate pairs,
        # checked on pop so entries made stale by an earlier merge are dropped.
        cdef int32_t *nxt = <int32_t *>malloc(n * sizeof(int32_t))
        cdef int32_t *prv = <int32_t *>malloc(n * sizeof(int32_t))
        cdef Py_ssize_t cap = 3 * n + 4, size = 0, i, j, c, out
        cdef _BpeHeapItem *heap = <_BpeHeapItem *>malloc(cap * sizeof(_BpeHeapItem))
        cdef _BpeHeapItem item, tmp
        cdef _BpeSlot *s
        cdef int32_t p, q, r
        if nxt == NULL or prv == NULL or heap == NULL:
            free(nxt); free(prv); free(heap)
            with gil:
                raise MemoryError()
        for i in range(n):
            nxt[i] = <int32_t>(i + 1) if i + 1 < n else -1
            prv[i] = <int32_t>(i - 1)
        for i in range(n - 1):
            s = self._find(ids[i], ids[i + 1])
            if s != NULL:
                heap[size].rank = s.rank; heap[size].pos = <int32_t>i
                heap[size].left = ids[i]; heap[size].right = ids[i + 1]
                size += 1
        # heapify
        i = size // 2 - 1
        while i >= 0:
            j = i
            while True:
                c = 2 * j + 1
                if c >= size:
                    break
                if c + 1 < size and _heap_less(&heap[c + 1], &heap[c]):
                    c += 1
                if not _heap_less(&heap[c], &heap[j]):
                    break
                tmp = heap[c]; heap[c] = heap[j]; heap[j] = tmp
                j = c
            i -= 1
        while size > 0:
            item = heap[0]
            size -= 1
            heap[0] = heap[size]
            j = 0
            while True:
                c = 2 * j + 1
                if c >= size:
                    break
                if c + 1 < size and _heap_less(&heap[c + 1], &heap[c]):
                    c += 1
                if not _heap_less(&heap[c], &heap[j]):
                    break
                tmp = heap[c]; heap[c] = heap[j]; heap[j] = tmp
                j = c
            p = item.pos
            q = nxt[p]
            if ids[p] != item.left or q < 0 or ids[q] != item.right or ids[p] < 0:
                continue
            s = self._find(item.left, item.right)
            ids[p] = s.new_id
            ids[q] = -1          # dead
            r = nxt[q]
            nxt[p] = r
            if r >= 0:
                prv[r] = p
            # new candidate pairs with both neighbours
            for r in range(2):
                if r == 0:
                    if prv[p] < 0:
                        continue
                    i = prv[p]; j = p
                else:
                    if nxt[p] < 0:
                        continue
                    i = p; j = nxt[p]
                s = self._find(ids[i], ids[j])
                if s == NULL:
                    continue
                if size == cap:
                    cap *= 2
                    heap = <_BpeHeapItem *>realloc(heap, cap * sizeof(_BpeHeapItem))
                    if heap == NULL:
                        free(nxt); free(prv)
                        with gil:
                            raise MemoryError()
                heap[size].rank = s.rank; heap[size].pos = <int32_t>i
                heap[size].left = ids[i]; heap[size].right = ids[j]
                c = size
                size += 1
                while c > 0 and _heap_less(&heap[c], &heap[(c - 1) // 2]):
                    tmp = heap[c]; heap[c] = heap[(c - 1) // 2]; heap[(c - 1) // 2] = tmp
                    c = (c - 1) // 2
        out = 0
        for i in range(n):
            if ids[i] >= 0:
                ids[out] = ids[i]
                out += 1
        free(nxt); free(prv); free(heap)
        return out

    cdef tuple _encode_utf8(self, const char *data, Py_ssize_t n):
        cdef int32_t small[_BPE_SCAN_MAX]
        cdef int32_t *ids = small
        cdef Py_ssize_t i, m
        cdef tuple result
        cdef bint heap_alloc = n > _BPE_SCAN_MAX
        cdef Py_ssize_t k = 0
        cdef int32_t b
        if heap_alloc:
            ids = <int32_t *>malloc(n * sizeof(int32_t))
            if ids == NULL:
                raise MemoryError()
        try:
            for i in range(n):
                b = self.byte_ids[<unsigned char>data[i]]
                if b >= 0:          # a byte with no token is dropped, as tokenizers does
                    ids[k] = b
                    k += 1
            n = k
            if n > _BPE_SCAN_MAX:
                m = self._merge_heap(ids, n)
            else:
                m = self._merge_scan(ids, n)
            result = tuple([ids[i] for i in range(m)])
        finally:
            if heap_alloc:
                free(ids)
        return result

    def encode_word(self, str word):
        """ids of one pre-token (no cache)."""
        cdef Py_ssize_t n
        cdef const char *data = PyUnicode_AsUTF8AndSize(word, &n)
        return list(self._encode_utf8(data, n))

    def encode_words(self, list words, dict cache, list out):
        """Append the ids of every pre-token in `words` to `out`, through `cache` (word -> tuple)."""
        cdef Py_ssize_t n
        cdef const char *data
        cdef object word, hit
        cdef tuple ids
        for word in words:
            hit = cache.get(word)
            if hit is not None:
                out.extend(<tuple>hit)
                continue
            data = PyUnicode_AsUTF8AndSize(word, &n)
            ids = self._encode_utf8(data, n)
            if n <= _BPE_CACHE_MAX_WORD and len(cache) < self.cache_limit:
                cache[word] = ids
            out.extend(ids)
        return out
