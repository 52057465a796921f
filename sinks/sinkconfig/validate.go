package sinkconfig

import "fmt"

// NotNegative returns an error naming key when value is below zero, and
// nil otherwise: the check of a count, size or duration setting whose zero
// means its default. Every sink words the refusal the same way:
// "max_pending: -1 must not be negative", "timeout: -1s must not be
// negative". A Validate checks several settings at once with cmp.Or, which
// returns the first error.
func NotNegative[T ~int | ~int64](key string, value T) error {
	if value < 0 {
		return fmt.Errorf("%s: %v must not be negative", key, value)
	}
	return nil
}
