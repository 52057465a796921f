// Package relay is Herald's engine: it claims committed outbox rows in
// batches, publishes them to sinks outside any database transaction, and
// records each row's outcome: delivered, retry with backoff, or dead letter.
//
// Per-key order comes from two mechanisms. Lanes (hashtext(key) & 63, or the
// id's hash for an event without a key) are leased to relays in blocks, so
// all events of one key are claimed by one relay at a time, whatever the
// number of keys. Holds record, per key and sink, an event
// waiting for its retry; later events of that key are parked until it clears,
// while every other key keeps flowing.
package relay
