// Package relay is Herald's engine: it claims committed outbox rows in
// batches, publishes them to sinks outside any database transaction, and
// records each row's outcome: delivered, retry with backoff, or dead letter.
//
// Per-key order comes from two mechanisms. Lanes (hashtext(key) & 63, or the
// id's hash for an event without a key) are leased to relays in blocks, so
// all events of one key are claimed by one relay at a time, whatever the
// number of keys. Per-sink delivery queues (the deliveries table) hold, per
// key and sink, the event that failed and the key's later events behind it:
// only a queue's head is ever due, and when it is delivered, dead-lettered
// or purged the next one becomes due in the same statement, while every
// other key and every other sink keeps flowing. An event whose sinks all
// succeed is deleted and never touches a queue.
package relay
