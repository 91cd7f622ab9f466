// A Confluent-compatible Schema Registry for tests and trials: franz-go's
// in-memory srfake server on a port. Nothing is kept across restarts.
//
//	schema-registry [-addr 127.0.0.1:0] [-auth 'Basic dXNlcjpwYXNz']
//
// It prints the address it listens on as its first line of output, then
// serves until it is killed. Built by pipeline/registry_local.py (./run setup).
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/twmb/franz-go/pkg/sr/srfake"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "host:port to listen on (port 0: a free one)")
	auth := flag.String("auth", "", "if set, the exact Authorization header every request must carry")
	flag.Parse()
	var opts []srfake.Option
	if *auth != "" {
		opts = append(opts, srfake.WithAuth(*auth))
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "schema-registry:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	if err := http.Serve(ln, srfake.NewRegistry(opts...).Handler()); err != nil {
		fmt.Fprintln(os.Stderr, "schema-registry:", err)
		os.Exit(1)
	}
}
