package bindings

import "github.com/kvrouter/kvrouter/workerref"

// Target is workerref.Target under its old name.
//
// Deprecated: use workerref.Target. This alias only keeps router/host
// compiling until the merge of issue 11 moves it to workerref; delete this
// file then.
type Target = workerref.Target
