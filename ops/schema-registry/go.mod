module pipeline/schema-registry

go 1.24.0

require github.com/twmb/franz-go/pkg/sr v1.8.0
