package workers

import (
	"context"
	"fmt"
	"slices"
)

// LoRA adapters in the registry. A worker that serves adapters (vLLM
// started with --enable-lora --lora-modules, or adapters loaded at run time)
// lists them in Info.Adapters under the names requests give as "model";
// Info.Model stays the base model, so the worker is a member of the base
// model's fleet. Info.LoadedAdapters is the part of them the engine holds on
// its GPU as far as the registrant last saw (a bridge learns it from the
// engine's KV events and metrics, workers/bridge/adapters.go): a request for
// one of them runs without loading its weights first. Both lists are sorted
// and carry no duplicates; a value without them is the value written before
// adapters existed, so older readers and writers interoperate.

// Limits on the adapter lists of an Info.
const (
	MaxAdapters = 128 // names per list
	// MaxAdapterBytes bounds the bytes of both lists' names together, so
	// that an Info with every list and label at its limit still fits in
	// MaxInfoBytes.
	MaxAdapterBytes = 16 << 10
)

// ServesAdapter reports whether the worker lists adapter name.
func (i Info) ServesAdapter(name string) bool {
	_, ok := slices.BinarySearch(i.Adapters, name)
	return ok
}

// AdapterLoaded reports whether adapter name is resident on the worker's
// GPU, as last reported.
func (i Info) AdapterLoaded(name string) bool {
	_, ok := slices.BinarySearch(i.LoadedAdapters, name)
	return ok
}

func (i Info) adaptersEqual(o Info) bool {
	return slices.Equal(i.Adapters, o.Adapters) && slices.Equal(i.LoadedAdapters, o.LoadedAdapters) && i.MaxLoRAs == o.MaxLoRAs
}

// validateAdapters checks the adapter lists: printable names, sorted, no
// duplicates, within MaxAdapters and MaxAdapterBytes.
func (i Info) validateAdapters() error {
	bytes := 0
	for _, l := range []struct {
		field string
		names []string
	}{{"adapters", i.Adapters}, {"loaded_adapters", i.LoadedAdapters}} {
		if len(l.names) > MaxAdapters {
			return &InfoError{ID: i.ID, Field: l.field, Reason: fmt.Sprintf("%d adapters, more than %d", len(l.names), MaxAdapters)}
		}
		for n, name := range l.names {
			if err := checkName(name, MaxIDLen); err != "" {
				return &InfoError{ID: i.ID, Field: l.field, Reason: fmt.Sprintf("adapter %q: %s", name, err)}
			}
			if n > 0 && l.names[n-1] >= name {
				return &InfoError{ID: i.ID, Field: l.field, Reason: fmt.Sprintf("adapter %q after %q: want sorted names without duplicates", name, l.names[n-1])}
			}
			bytes += len(name)
		}
	}
	if bytes > MaxAdapterBytes {
		return &InfoError{ID: i.ID, Field: "adapters", Reason: fmt.Sprintf("%d bytes of adapter names, more than %d", bytes, MaxAdapterBytes)}
	}
	if i.MaxLoRAs < 0 {
		return &InfoError{ID: i.ID, Field: "max_loras", Reason: fmt.Sprintf("%d, must not be negative", i.MaxLoRAs)}
	}
	return nil
}

// SortAdapters returns names sorted, without duplicates or empty names,
// cut to MaxAdapters: the form Info's lists take.
func SortAdapters(names []string) []string {
	out := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == "" })
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > MaxAdapters {
		out = out[:MaxAdapters]
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// SetAdapters replaces the worker's adapter lists (sorted by SortAdapters)
// and its MaxLoRAs, and writes them at once when they changed. On a
// transient failure the new lists are kept and the heartbeat keeps trying
// to write them; the error is returned.
func (r *Registration) SetAdapters(ctx context.Context, served, loaded []string, maxLoRAs int) error {
	return r.update(ctx, func(i *Info) bool {
		was := Info{Adapters: i.Adapters, LoadedAdapters: i.LoadedAdapters, MaxLoRAs: i.MaxLoRAs}
		i.Adapters, i.LoadedAdapters, i.MaxLoRAs = SortAdapters(served), SortAdapters(loaded), maxLoRAs
		return !i.adaptersEqual(was)
	})
}
