// Package jskv holds the JetStream KV machinery that bindings and workers
// both need and that the nats.go KV client does not offer: buckets whose
// keys carry their own TTL, compare-and-set writes that keep that TTL,
// the classification of a lost compare-and-set, and reads answered by the
// stream leader only (or, on a one-replica stream, by its only server).
//
// What it owns:
//   - EnsureBucket (bucket.go): bind to or create a KV bucket with History 1
//     and LimitMarkerTTL, and refuse an existing one that cannot carry
//     per-key TTLs safely (*BucketConfigError, ErrBucketConfig).
//   - Owner, Limits, Reconcile and WaitBucket (own.go): the owner of a
//     stream or bucket (the router replica) verifies an existing one's
//     replicas, max bytes and max age against its configuration and
//     reports each Mismatch or updates it; processes that only use one
//     wait for it (AwaitCreated, WaitBucket) and never create or change it.
//   - Publish and AsConflict (conflict.go): the raw conditional publish
//     (WithExpectLastSequencePerSubject + WithMsgTTL; kv.Update would drop
//     the key's TTL) and the mapping of API codes 10071 and 10164, and of
//     the KV client's ErrKeyExists / ErrKeyRevisionMismatch, to
//     *ConflictError, which matches ErrConflict.
//   - LastMsg (read.go): $JS.API.STREAM.MSG.GET.KV_<bucket> with
//     last_by_subj, honouring a custom API prefix (domains), and the
//     decoding of its JSON reply; a missing subject is ErrNoMessage.
//   - DirectLastMsg (direct.go): the same read as a direct get, answered
//     by any server holding the stream, for one-replica streams; an answer
//     from another stream (a mirror) is ErrNotOrigin.
//
// What it does not own: keys, values, retries and policies (what a conflict
// or a tombstone means is the caller's business), nor the callers' error
// vocabulary. bindings and workers keep their own sentinel errors and wrap
// these (bindings.ErrConflict and workers' *ConflictError both also match
// ErrConflict). Error texts here carry no package prefix, because callers
// put theirs in front.
//
// It imports neither bindings nor workers, so both may use it. Start
// reading at Publish in conflict.go.
package jskv
