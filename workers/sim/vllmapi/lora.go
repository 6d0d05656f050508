package vllmapi

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// This file is the server's LoRA face, as vLLM's with --enable-lora
// (../shared/reference/protocols-engines-gateways.md, section 3):
// adapters are served under their own names (a request selects one by
// putting its name in "model"), listed in GET /v1/models with their parent,
// loaded and unloaded at run time through POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter when Config.RuntimeLoRA is set (vLLM:
// VLLM_ALLOW_RUNTIME_LORA_UPDATING), and reported in /metrics as
// vllm:lora_requests_info. Which adapters are resident on the GPU, and what
// a load costs, is the engine's (sim.Config.MaxLoRAs, LoRALoadTime).
// It also reads cache_salt, vLLM's per-request prefix-cache isolation.

// Adapter is one LoRA adapter, as vLLM's --lora-modules gives it.
type Adapter struct {
	Name string // the model name requests use
	Path string // the adapter's path (the simulator reads nothing there); its card's root
	Base string // base_model_name; "" = the served model (vLLM: the first served model)
}

// ParseLoRAModule reads one --lora-modules item: name=path, or the JSON
// form {"name": ..., "path": ..., "base_model_name": ...}.
func ParseLoRAModule(s string) (Adapter, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") {
		var m struct {
			Name string `json:"name"`
			Path string `json:"path"`
			Base string `json:"base_model_name"`
		}
		if err := decodeBody([]byte(s), &m); err != nil {
			return Adapter{}, fmt.Errorf("lora module %s: %w", s, err)
		}
		if m.Name == "" || m.Path == "" {
			return Adapter{}, fmt.Errorf("lora module %s: name and path are required", s)
		}
		return Adapter{Name: m.Name, Path: m.Path, Base: m.Base}, nil
	}
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return Adapter{}, fmt.Errorf("lora module %q: want name=path or a JSON object with name, path and base_model_name", s)
	}
	return Adapter{Name: name, Path: path}, nil
}

// loraEntry is one served adapter.
type loraEntry struct {
	Adapter
	id int // vLLM's lora_int_id: 1, 2, ... in the order adapters were added
}

// loras is the server's adapter table.
type loras struct {
	mu     sync.Mutex
	byName map[string]loraEntry
	nextID int
}

// lookup returns the adapter a request's model names; ok is false for the
// served model (or none).
func (l *loras) lookup(model string) (loraEntry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.byName[model]
	return e, ok
}

// add registers a; it fails when the name is taken.
func (l *loras) add(a Adapter) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, dup := l.byName[a.Name]; dup {
		return fmt.Errorf("The lora adapter '%s' has already been loaded.", a.Name)
	}
	l.nextID++
	l.byName[a.Name] = loraEntry{Adapter: a, id: l.nextID}
	return nil
}

func (l *loras) remove(name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.byName[name]
	delete(l.byName, name)
	return ok
}

// list returns the adapters in the order they were added.
func (l *loras) list() []loraEntry {
	l.mu.Lock()
	out := make([]loraEntry, 0, len(l.byName))
	for _, e := range l.byName {
		out = append(out, e)
	}
	l.mu.Unlock()
	slices.SortFunc(out, func(a, b loraEntry) int { return a.id - b.id })
	return out
}

// setUpLoRA adds the configured adapters and, with Config.RuntimeLoRA, the
// load and unload endpoints; adapters need Config.EnableLoRA, as in vLLM.
func (s *Server) setUpLoRA() error {
	s.lora = &loras{byName: map[string]loraEntry{}}
	if !s.cfg.EnableLoRA {
		if len(s.cfg.Adapters) > 0 || s.cfg.RuntimeLoRA {
			return errors.New("vllmapi: LoRA adapters need EnableLoRA (vLLM's --enable-lora)")
		}
		return nil
	}
	for _, a := range s.cfg.Adapters {
		if a.Name == "" || a.Path == "" {
			return fmt.Errorf("vllmapi: LoRA adapter %+v: name and path are required", a)
		}
		if a.Name == s.cfg.Model {
			return fmt.Errorf("vllmapi: LoRA adapter %q has the served model's name", a.Name)
		}
		if err := s.lora.add(a); err != nil {
			return fmt.Errorf("vllmapi: %w", err)
		}
	}
	if s.cfg.RuntimeLoRA {
		s.mux.HandleFunc("POST /v1/load_lora_adapter", s.loadLoRA)
		s.mux.HandleFunc("POST /v1/unload_lora_adapter", s.unloadLoRA)
		s.log.Warn("LoRA dynamic loading & unloading is enabled in the API server. This should ONLY be used for local development!")
	}
	return s.metrics.reg.Register(&loraCollector{s: s, info: prometheus.NewDesc("vllm:lora_requests_info",
		"Running stats on lora requests.", []string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"}, nil),
		loads: prometheus.NewDesc("kvr_sim_lora_loads_total",
			"LoRA adapters loaded onto the rank's GPU (not a vLLM metric).", labels, nil)})
}

type loadLoRARequest struct {
	LoraName string `json:"lora_name"`
	LoraPath string `json:"lora_path"`
}

func (l *loadLoRARequest) modelName() string { return "" }

type unloadLoRARequest struct {
	LoraName  string `json:"lora_name"`
	LoraIntID *int   `json:"lora_int_id"`
}

func (u *unloadLoRARequest) modelName() string { return "" }

// loadLoRA is POST /v1/load_lora_adapter: the adapter is served from now
// on (its weights reach the GPU when a request first needs them).
func (s *Server) loadLoRA(w http.ResponseWriter, r *http.Request) {
	var req loadLoRARequest
	if !s.decode(w, r, &req) {
		return
	}
	if req.LoraName == "" || req.LoraPath == "" {
		writeError(w, badRequest("Both 'lora_name' and 'lora_path' must be provided."))
		return
	}
	if req.LoraName == s.cfg.Model {
		writeError(w, badRequest("The lora adapter '%s' has the served model's name.", req.LoraName))
		return
	}
	if err := s.lora.add(Adapter{Name: req.LoraName, Path: req.LoraPath}); err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	s.log.Info("loaded new LoRA adapter", "name", req.LoraName, "path", req.LoraPath)
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoraName))
}

// unloadLoRA is POST /v1/unload_lora_adapter: the adapter is no longer
// served and leaves the engine's GPU slots.
func (s *Server) unloadLoRA(w http.ResponseWriter, r *http.Request) {
	var req unloadLoRARequest
	if !s.decode(w, r, &req) {
		return
	}
	if req.LoraName == "" {
		writeError(w, badRequest("'lora_name' needs to be provided to unload a LoRA adapter."))
		return
	}
	if !s.lora.remove(req.LoraName) {
		writeError(w, notFound("The lora adapter '%s' cannot be found.", req.LoraName))
		return
	}
	s.eng.RemoveLoRA(req.LoraName)
	s.log.Info("removed LoRA adapter", "name", req.LoraName)
	writeText(w, fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoraName))
}

func writeText(w http.ResponseWriter, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(msg))
}

// adapterCard is an adapter's entry in GET /v1/models, as vLLM's: root the
// adapter's path, parent its base model, no max_model_len (null).
type adapterCard struct {
	ID          string `json:"id"`
	Object      string `json:"object"`
	Created     int64  `json:"created"`
	OwnedBy     string `json:"owned_by"`
	Root        string `json:"root"`
	Parent      string `json:"parent"`
	MaxModelLen *int   `json:"max_model_len"`
}

// models is GET /v1/models: the served model, then its adapters.
func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	data := []any{modelCard{ID: s.cfg.Model, Object: "model", Created: s.started, OwnedBy: "vllm", Root: s.cfg.Model,
		MaxModelLen: s.cfg.MaxModelLen}}
	for _, e := range s.lora.list() {
		parent := e.Base
		if parent == "" {
			parent = s.cfg.Model
		}
		data = append(data, adapterCard{ID: e.Name, Object: "model", Created: s.started, OwnedBy: "vllm", Root: e.Path, Parent: parent})
	}
	writeJSON(w, http.StatusOK, struct {
		Object string `json:"object"`
		Data   []any  `json:"data"`
	}{"list", data})
}

// jobKeys resolves what of a generate request enters the engine's hash
// besides its tokens: the adapter its model names and its cache_salt
// (vLLM's rule: a non-empty string when given). It fills j.
func (s *Server) jobKeys(sp *sampling, j *job) *Error {
	j.model = s.cfg.Model
	if e, ok := s.lora.lookup(sp.Model); ok {
		j.model, j.lora, j.loraID = e.Name, e.Name, e.id
	}
	if sp.CacheSalt != nil {
		if *sp.CacheSalt == "" {
			return badRequest("Parameter 'cache_salt' must be a non-empty string if provided.")
		}
		j.salt = *sp.CacheSalt
	}
	return nil
}

// loraCollector reads the engine's adapters at scrape time:
// vllm:lora_requests_info as vLLM exports it (one series, its labels the
// slot count and the adapters of the running and waiting requests,
// comma-separated, over every rank; the value the time of the scrape, as
// vLLM sets it to the current time) and the simulator's load counter per
// rank.
type loraCollector struct {
	s           *Server
	info, loads *prometheus.Desc
}

func (c *loraCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.info
	ch <- c.loads
}

func (c *loraCollector) Collect(ch chan<- prometheus.Metric) {
	var running, waiting []string
	for i, st := range c.s.eng.LoRAState() {
		running, waiting = append(running, st.Running...), append(waiting, st.Waiting...)
		ch <- prometheus.MustNewConstMetric(c.loads, prometheus.CounterValue, float64(st.Loads), c.s.cfg.Model, c.s.metrics.ranks[i])
	}
	join := func(s []string) string {
		slices.Sort(s)
		return strings.Join(slices.Compact(s), ",")
	}
	max := c.s.eng.Config().MaxLoRAs
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, float64(time.Now().UnixNano())/1e9,
		strconv.Itoa(max), join(waiting), join(running))
}
