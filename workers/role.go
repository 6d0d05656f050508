package workers

import (
	"encoding/json"
	"fmt"
)

// Role is the part a worker plays in a prefill/decode-disaggregated fleet
// (docs/pd.md). A worker registered without one ("" on the wire) is a whole
// engine, RoleBoth, so a value written before roles existed reads the same.
type Role string

const (
	// RoleBoth: the worker serves whole requests and either leg of a split
	// one (vLLM kv_role kv_both, SGLang without disaggregation).
	RoleBoth Role = "both"
	// RolePrefill: the worker takes only prefill legs (vLLM kv_producer,
	// SGLang --disaggregation-mode prefill).
	RolePrefill Role = "prefill"
	// RoleDecode: the worker takes decode legs and whole requests (vLLM
	// kv_consumer, SGLang --disaggregation-mode decode). A vLLM decode
	// engine computes a whole prompt itself when it is given no
	// kv_transfer_params, which is what a gateway's fallback relies on.
	RoleDecode Role = "decode"
)

// Valid reports whether r is "" (both) or one of the three roles.
func (r Role) Valid() bool { return r == "" || r == RoleBoth || r == RolePrefill || r == RoleDecode }

// Or returns r, with "" read as RoleBoth.
func (r Role) Or() Role {
	if r == "" {
		return RoleBoth
	}
	return r
}

// Prefills reports whether the worker takes prefill legs.
func (r Role) Prefills() bool { return r.Or() != RoleDecode }

// Decodes reports whether the worker takes decode legs and whole requests.
func (r Role) Decodes() bool { return r.Or() != RolePrefill }

// ParseRole reads a role by its own name (prefill, decode, both; "" =
// both), vLLM's kv_role (kv_producer, kv_consumer, kv_both) or SGLang's
// --disaggregation-mode (prefill, decode, null).
func ParseRole(s string) (Role, error) {
	switch s {
	case "", "both", "kv_both", "null":
		return RoleBoth, nil
	case "prefill", "kv_producer":
		return RolePrefill, nil
	case "decode", "kv_consumer":
		return RoleDecode, nil
	}
	return "", fmt.Errorf("workers: role %q: want prefill, decode or both (or vLLM's kv_producer, kv_consumer, kv_both)", s)
}

// RoleFromKVTransferConfig reads the role from vLLM's --kv-transfer-config
// JSON (its kv_role; "" = both).
func RoleFromKVTransferConfig(config string) (Role, error) {
	if config == "" {
		return RoleBoth, nil
	}
	var c struct {
		KVRole string `json:"kv_role"`
	}
	if err := json.Unmarshal([]byte(config), &c); err != nil {
		return "", fmt.Errorf("workers: kv-transfer-config %q: %w", config, err)
	}
	return ParseRole(c.KVRole)
}
