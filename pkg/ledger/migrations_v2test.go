//go:build caa_ledger_v2test

package ledger

import (
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// This file makes a test-only "next version" of caa (go build -tags
// caa_ledger_v2test): it migrates the ledger to schema 2 with an additive
// change and writes a record field today's caa does not know, so a real
// roll forward and back between two builds can be tested (test/e2e).

// tagV2Test is the test-only record field; real fields never use it.
const tagV2Test = 1000

var bucketV2Test = []byte("v2test")

func buildMigrations() []migration {
	return []migration{{To: 3, Name: "test-only-v2-bucket", Run: func(tx *bolt.Tx) error {
		if _, err := tx.CreateBucketIfNotExists(bucketV2Test); err != nil {
			return fmt.Errorf("create bucket %s: %w", bucketV2Test, err)
		}
		return nil
	}}}
}

func buildRecordFields(b []byte, r Record) []byte {
	if hasField(r.unknown, tagV2Test) {
		return b
	}
	return appendString(b, tagV2Test, "written by the v2 test build")
}
