package main

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/workers/sim/vllmapi"
)

// sim serve's LoRA flags, named and checked as vLLM's
// (../shared/reference/protocols-engines-gateways.md, section 3), and
// VLLM_ALLOW_RUNTIME_LORA_UPDATING, read from the environment as vLLM
// reads it.

// DefaultLoRALoadTime is the model time a step spends loading an adapter
// that is not on the GPU (not a vLLM flag: vLLM's time is the real one).
const DefaultLoRALoadTime = 2 * time.Second

// runtimeLoRAEnv enables /v1/load_lora_adapter and /v1/unload_lora_adapter.
const runtimeLoRAEnv = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

// vLLM's accepted --max-lora-rank values.
var loraRanks = []int{1, 8, 16, 32, 64, 128, 256, 320, 512}

type simLoRAFlags struct {
	enable                    *bool
	modules                   *stringList
	maxLoRAs, maxCPU, maxRank *int
	loadTime                  *time.Duration
}

// stringList is a flag given once per value; vLLM's --lora-modules takes
// several values after one flag, which expandNargs rewrites into this form.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func addSimLoRAFlags(c *cmdFlags) *simLoRAFlags {
	f := &simLoRAFlags{
		enable:   c.boolean("enable-lora", false, "serve LoRA adapters (as vLLM): --lora-modules, and /v1/load_lora_adapter and /v1/unload_lora_adapter when "+runtimeLoRAEnv+" is true"),
		modules:  &stringList{},
		maxLoRAs: c.integer("max-loras", 1, "LoRA adapters resident at once per rank (and in one step's batch); least recently used out"),
		maxCPU:   c.integer("max-cpu-loras", 0, "vLLM's CPU adapter cache (0 = --max-loras); checked as vLLM does, not modelled: every load costs --lora-load-time"),
		maxRank:  c.integer("max-lora-rank", 16, "accepted and checked (vLLM flag; 1, 8, 16, 32, 64, 128, 256, 320 or 512); the simulator has no weights"),
		loadTime: c.duration("lora-load-time", DefaultLoRALoadTime, "model time a step spends loading each adapter it needs that is not resident (not a vLLM flag)"),
	}
	c.track("lora-modules")
	c.Var(f.modules, "lora-modules", "LoRA adapters: name=path or {\"name\":…,\"path\":…,\"base_model_name\":…}, several after one flag as in vLLM, or the flag repeated")
	return f
}

// apply checks the flags and sets the engine's and the HTTP face's LoRA
// configuration.
func (f *simLoRAFlags) apply(cfg *simServeConfig) error {
	runtime := loraEnvTrue(os.Getenv(runtimeLoRAEnv))
	if !*f.enable {
		if len(*f.modules) > 0 {
			return errors.New("--lora-modules needs --enable-lora")
		}
		return nil
	}
	switch {
	case *f.maxLoRAs < 1:
		return fmt.Errorf("--max-loras %d: want at least 1", *f.maxLoRAs)
	case *f.maxCPU != 0 && *f.maxCPU < *f.maxLoRAs:
		return fmt.Errorf("--max-cpu-loras %d: must be at least --max-loras (%d)", *f.maxCPU, *f.maxLoRAs)
	case !slices.Contains(loraRanks, *f.maxRank):
		return fmt.Errorf("--max-lora-rank %d: want one of %v", *f.maxRank, loraRanks)
	case *f.loadTime < 0:
		return fmt.Errorf("--lora-load-time %v: want >= 0", *f.loadTime)
	}
	for _, m := range *f.modules {
		a, err := vllmapi.ParseLoRAModule(m)
		if err != nil {
			return fmt.Errorf("--lora-modules: %w", err)
		}
		cfg.adapters = append(cfg.adapters, a)
	}
	cfg.enableLoRA, cfg.runtimeLoRA = true, runtime
	cfg.engine.MaxLoRAs, cfg.engine.LoRALoadTime = *f.maxLoRAs, *f.loadTime
	return nil
}

// loraEnvTrue is vLLM's reading of the variable: "1" or "true", any case.
func loraEnvTrue(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	return v == "1" || v == "true"
}

// expandNargs rewrites vLLM's "--lora-modules a=/p b=/q" (several values
// after one flag) into "--lora-modules a=/p --lora-modules b=/q". A value
// is a name=path or a JSON object; the first argument that is neither (a
// flag, MODEL) ends the list.
func expandNargs(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		if a != "--lora-modules" && a != "-lora-modules" {
			continue
		}
		for n := 0; i+1 < len(args); n++ {
			v := args[i+1]
			if strings.HasPrefix(v, "-") || !(strings.HasPrefix(strings.TrimSpace(v), "{") || strings.Contains(v, "=")) {
				break
			}
			if n > 0 {
				out = append(out, a)
			}
			out = append(out, v)
			i++
		}
	}
	return out
}

// loraWhat is the startup line's account of the adapters.
func loraWhat(cfg simServeConfig) string {
	if !cfg.enableLoRA {
		return ""
	}
	names := make([]string, len(cfg.adapters))
	for i, a := range cfg.adapters {
		names[i] = a.Name
	}
	s := fmt.Sprintf("; LoRA adapters %q, %d resident at once", names, cfg.engine.MaxLoRAs)
	if cfg.runtimeLoRA {
		s += ", runtime loading on"
	}
	return s
}
