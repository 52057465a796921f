package deadletter

// SetBatchSize sets the rows per statement of s, for tests that walk
// several batches without writing thousands of rows.
func SetBatchSize(s *Store, n int) { s.batchSize = n }
