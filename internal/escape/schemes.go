package escape

// The three schemes kvrouter puts names through, one per place a name goes.
// Each is on the wire or in a stored bucket, so its bytes never change: the
// golden tests in schemes_test.go pin them. They are read-only after package
// init and safe for concurrent use.
var (
	// SubjectToken escapes a model, worker or replica name into one NATS
	// subject token: printable ASCII except '.', '*', '>' and '%' is kept;
	// every other byte (space and other whitespace, control bytes, '.',
	// '*', '>', '%', bytes >= 0x7f) becomes "%XX"; the empty name is "%".
	// Event, load, generate and route API subjects and the event stream's
	// message ids use it.
	SubjectToken = New('%', subjectSafe)

	// WorkerKey escapes a worker id into its worker registry KV key
	// (kvr-workers): [A-Za-z0-9_-] is kept; every other byte, including
	// '.', '/', '=' and any non-ASCII byte, becomes "=XX"; the empty id is
	// "=". '%' is not in the KV key alphabet, hence not SubjectToken; a key
	// is also one subject token ('.' is escaped), so it can be watched
	// alone, and typical ids ("worker-0", "llama_8b") stay readable.
	WorkerKey = New('=', workerKeySafe)

	// BindingKey escapes a model or a session id into one token of a
	// session binding's KV key (kvr-bindings, "<model>.<session>"):
	// [A-Za-z0-9-] is kept; every other byte becomes "_XX"; the empty name
	// is "_".
	BindingKey = New('_', bindingKeySafe)
)

func subjectSafe(c byte) bool {
	return c > ' ' && c < 0x7f && c != '.' && c != '*' && c != '>' && c != '%'
}

func workerKeySafe(c byte) bool { return bindingKeySafe(c) || c == '_' }

func bindingKeySafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}
