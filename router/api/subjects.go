package api

import "github.com/kvrouter/kvrouter/internal/escape"

// DefaultPrefix is the subject prefix of every kvrouter subject.
const DefaultPrefix = "kvr"

// DefaultQueueGroup is the NATS queue group the replicas of one deployment
// share, so each request reaches exactly one of them.
const DefaultQueueGroup = "kvr-router"

// Subjects of the NATS API. Model and replica names are escaped with
// internal/escape's SubjectToken so that any name is one valid token.
//
//	<prefix>.route.<model>            route request -> RouteResponse (queue group)
//	<prefix>.prefill_done.<model>     LifecycleRequest -> LifecycleResponse (queue group)
//	<prefix>.free.<model>             LifecycleRequest -> LifecycleResponse (queue group)
//	<prefix>.cancel.<model>           LifecycleRequest -> LifecycleResponse (queue group)
//	<prefix>.workers.<model>          {} -> WorkersResponse (queue group)
//	<prefix>.sessions.get.<model>     SessionRequest -> SessionResponse (queue group)
//	<prefix>.sessions.end.<model>     SessionRequest -> {"v":1,"ended":true} (queue group)
//	<prefix>.replica.<replica>.<op>   the same lifecycle ops addressed to one replica
//	<prefix>.bookings.<model>         replica booking sync (every replica, no queue group)
//	<prefix>.admin.<op>.<model>       a lifecycle op checked against no fence: operators only (queue group)
//	<prefix>.admin.replica.<replica>.<op>  the same, addressed to one replica
func RouteSubject(prefix, model string) string { return subj(prefix, "route", model) }

// LifecycleSubject is the queue-group subject of a lifecycle op
// (OpPrefillDone, OpFree, OpCancel or OpServeWhole) for a model.
func LifecycleSubject(prefix, op, model string) string { return subj(prefix, op, model) }

// ReplicaSubject is the subject of a lifecycle op addressed to one replica:
// the replica that holds the request's booking (RouteResponse.Replica).
func ReplicaSubject(prefix, replica, op string) string {
	return PrefixOrDefault(prefix) + ".replica." + escape.SubjectToken.Escape(replica) + "." + op
}

// AdminSubject is the queue-group subject of a lifecycle op an operator
// makes on anyone's request: the replica checks no fence, so only an
// operator's NATS user may publish on it (deploy/nats/auth.conf).
func AdminSubject(prefix, op, model string) string { return subj(prefix, "admin."+op, model) }

// AdminReplicaSubject is AdminSubject addressed to one replica.
func AdminReplicaSubject(prefix, replica, op string) string {
	return PrefixOrDefault(prefix) + ".admin.replica." + escape.SubjectToken.Escape(replica) + "." + op
}

// WorkersSubject lists a model's workers as one replica sees them.
func WorkersSubject(prefix, model string) string { return subj(prefix, "workers", model) }

// SessionGetSubject reads a session binding.
func SessionGetSubject(prefix, model string) string { return subj(prefix, "sessions.get", model) }

// SessionEndSubject ends a session binding.
func SessionEndSubject(prefix, model string) string { return subj(prefix, "sessions.end", model) }

// BookingsSubject carries replica booking sync for a model.
func BookingsSubject(prefix, model string) string { return subj(prefix, "bookings", model) }

// DecisionsSubject carries a model's shared routing decisions (replica
// decision sync, a binary format: decisions.go).
func DecisionsSubject(prefix, model string) string { return subj(prefix, "decisions", model) }

func subj(prefix, kind, model string) string {
	return PrefixOrDefault(prefix) + "." + kind + "." + escape.SubjectToken.Escape(model)
}

// PrefixOrDefault is prefix, or DefaultPrefix when it is empty.
func PrefixOrDefault(prefix string) string {
	if prefix == "" {
		return DefaultPrefix
	}
	return prefix
}

// Header names on NATS replies.
const (
	// HeaderStatus carries the HTTP-equivalent status of a reply ("200",
	// "400", "529"...). The body says the same in the error envelope; the
	// header lets a client branch without parsing. (NATS reserves "Status"
	// for its own no-responders replies, hence the prefix.)
	HeaderStatus = "Kvr-Status"
	// HeaderTraceparent is the W3C trace context header, lowercase as W3C
	// writes it; see HeaderCarrier.
	HeaderTraceparent = "traceparent"
	// HeaderReplica names the replica that published a booking sync
	// message, so replicas drop their own echoes without decoding them.
	HeaderReplica = "Kvr-Replica"
)
