// Command defaultpolicy prints the policy document the router ships with
// (policy.Default(): what it writes to Consul KV when none exists) as JSON, so
// bench/router-vs-nginx.sh benchmarks the default policy of this tree rather
// than a copy that could drift from it.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/oasis-llm/oasis/router/policy"
)

func main() {
	b, err := json.Marshal(policy.Default())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s\n", b)
}
