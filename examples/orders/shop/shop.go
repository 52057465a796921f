// Package shop is the order service of Herald's orders example: customers
// place orders and pay them, and every change commits together with the
// events that announce it, through the outbox.
//
// Creating an order enqueues orders.created; paying it runs one transaction
// that locks the order row (SELECT ... FOR UPDATE, so the events of one order
// are enqueued in order), sets its status to paid and enqueues orders.paid
// and email.order_paid. Every event's key is the order id. If any write
// fails, none happens: the order stays as it was and no event exists.
package shop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/mail"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/heraldhq/herald/outbox"
)

// Topics of the events the service enqueues.
const (
	TopicOrderCreated = "orders.created"
	TopicOrderPaid    = "orders.paid"
	TopicEmailPaid    = "email.order_paid"
)

// Order statuses.
const (
	StatusCreated = "created"
	StatusPaid    = "paid"
)

// DefaultSchema is the schema of the orders table when Config leaves it
// empty. On MySQL it means the database the connection opened, as it does
// for Herald's tables.
const DefaultSchema = "public"

// Limits on what an order may hold.
const (
	maxItems    = 100
	maxQuantity = 1000
	maxTextLen  = 200
)

// Errors the service returns; the HTTP handler maps them to status codes.
var (
	// ErrNotFound means no order has the given id.
	ErrNotFound = errors.New("shop: no such order")
	// ErrAlreadyPaid means the order was paid before; nothing changed.
	ErrAlreadyPaid = errors.New("shop: order already paid")
)

// InvalidError reports a refused order; Field names the request field.
type InvalidError struct {
	Field, Reason string
}

// Error returns e.g. "customer.email: is not an email address".
func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

// Config configures a Service.
type Config struct {
	// Schema holds the orders table (see Migrate and MigrateMySQL; on
	// MySQL, a database). Defaults to "public".
	Schema string
	// Outbox enqueues the events, in the same database as the orders: a
	// PostgreSQL Writer for New, a MySQL one (Dialect outbox.MySQL) for
	// NewMySQL. Required.
	Outbox *outbox.Writer
	// Currency is the currency of orders that name none. Defaults to "EUR".
	Currency string
	// EventHeaders are added to every event (for example a service name).
	EventHeaders map[string]string
	// OnCommit, when set, is called after each transaction that enqueued
	// events has committed, with those events. It must not block.
	OnCommit func(Commit)
	// Logger receives the service's logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// Commit describes a committed transaction and the events it enqueued.
type Commit struct {
	// OrderID is the order the transaction changed.
	OrderID string
	// Events are the enqueued events' ids, with their topics.
	Events []EventRef
	// At is when the commit returned.
	At time.Time
}

// EventRef names one enqueued event.
type EventRef struct {
	ID    uuid.UUID
	Topic string
}

// Customer is who places an order.
type Customer struct {
	Name  string `json:"name"`
	Email string `json:"email"`
}

// Item is one line of an order. Price is the unit price, a decimal number
// with at most two decimals (12.5 or 12.50).
type Item struct {
	Name  string      `json:"name"`
	Qty   int         `json:"qty"`
	Price json.Number `json:"price"`
}

// NewOrder is what placing an order takes.
type NewOrder struct {
	Customer Customer `json:"customer"`
	Items    []Item   `json:"items"`
	// Currency is a three-letter code. Defaults to Config.Currency.
	Currency string `json:"currency,omitempty"`
}

// Order is a stored order.
type Order struct {
	ID        string      `json:"id"`
	Customer  Customer    `json:"customer"`
	Items     []Item      `json:"items"`
	Total     json.Number `json:"total"`
	Currency  string      `json:"currency"`
	Status    string      `json:"status"`
	CreatedAt time.Time   `json:"created_at"`
	PaidAt    *time.Time  `json:"paid_at,omitempty"`
}

// storedItem is an item as the items column holds it.
type storedItem struct {
	Name       string `json:"name"`
	Qty        int    `json:"qty"`
	PriceCents int64  `json:"price_cents"`
}

// Service places and pays orders.
type Service struct {
	db  store
	cfg Config
	log *slog.Logger
}

// store is the service's database: the SQL of each database lives in its
// own file (postgres.go, mysql.go), the business logic here.
type store interface {
	// inTx runs fn in a transaction and commits it when fn returns nil.
	inTx(ctx context.Context, fn func(storeTx) error) error
	// get reads one order; ErrNotFound when there is none.
	get(ctx context.Context, id uuid.UUID) (*Order, error)
	// ping checks that the database answers.
	ping(ctx context.Context) error
}

// storeTx is a transaction of a store.
type storeTx interface {
	// insert stores a new order with status created and returns it.
	insert(ctx context.Context, o newRow) (*Order, error)
	// lockStatus locks the order's row and returns its status;
	// ErrNotFound when there is none.
	lockStatus(ctx context.Context, id uuid.UUID) (string, error)
	// markPaid sets a locked order's status to paid and returns it.
	markPaid(ctx context.Context, id uuid.UUID) (*Order, error)
	// enqueue writes events to the outbox in this transaction.
	enqueue(ctx context.Context, events []outbox.Event) ([]uuid.UUID, error)
}

// newRow is a validated order to insert.
type newRow struct {
	id         uuid.UUID
	customer   Customer
	items      []byte // JSON array of storedItem
	totalCents int64
	currency   string
}

// newService checks cfg and fills its defaults.
func newService(db store, cfg Config) (*Service, error) {
	if cfg.Outbox == nil {
		return nil, errors.New("shop: Config.Outbox is required")
	}
	if cfg.Schema == "" {
		cfg.Schema = DefaultSchema
	}
	if cfg.Currency == "" {
		cfg.Currency = "EUR"
	}
	if !validCurrency(cfg.Currency) {
		return nil, fmt.Errorf("shop: Config.Currency: %q is not a three-letter code such as EUR", cfg.Currency)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{db: db, cfg: cfg, log: cfg.Logger}, nil
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := range 3 {
		if c[i] < 'A' || c[i] > 'Z' {
			return false
		}
	}
	return true
}

// validate checks n and returns its items as stored and the total in cents.
func (s *Service) validate(n *NewOrder) ([]storedItem, int64, error) {
	n.Customer.Name = strings.TrimSpace(n.Customer.Name)
	n.Customer.Email = strings.TrimSpace(n.Customer.Email)
	if n.Currency == "" {
		n.Currency = s.cfg.Currency
	}
	switch {
	case n.Customer.Name == "":
		return nil, 0, &InvalidError{"customer.name", "required"}
	case len(n.Customer.Name) > maxTextLen:
		return nil, 0, &InvalidError{"customer.name", fmt.Sprintf("longer than %d bytes", maxTextLen)}
	case !validCurrency(n.Currency):
		return nil, 0, &InvalidError{"currency", fmt.Sprintf("%q is not a three-letter code such as EUR", n.Currency)}
	case len(n.Items) == 0:
		return nil, 0, &InvalidError{"items", "an order needs at least one item"}
	case len(n.Items) > maxItems:
		return nil, 0, &InvalidError{"items", fmt.Sprintf("at most %d items", maxItems)}
	}
	addr, err := mail.ParseAddress(n.Customer.Email)
	if err != nil || addr.Name != "" || len(n.Customer.Email) > maxTextLen {
		return nil, 0, &InvalidError{"customer.email", fmt.Sprintf("%q is not an email address", n.Customer.Email)}
	}
	items := make([]storedItem, len(n.Items))
	var total int64
	for i, it := range n.Items {
		field := fmt.Sprintf("items[%d]", i)
		name := strings.TrimSpace(it.Name)
		switch {
		case name == "":
			return nil, 0, &InvalidError{field + ".name", "required"}
		case len(name) > maxTextLen:
			return nil, 0, &InvalidError{field + ".name", fmt.Sprintf("longer than %d bytes", maxTextLen)}
		case it.Qty < 1 || it.Qty > maxQuantity:
			return nil, 0, &InvalidError{field + ".qty", fmt.Sprintf("must be between 1 and %d, got %d", maxQuantity, it.Qty)}
		}
		cents, err := parseCents(it.Price)
		if err != nil {
			return nil, 0, &InvalidError{field + ".price", err.Error()}
		}
		items[i] = storedItem{Name: name, Qty: it.Qty, PriceCents: cents}
		total += cents * int64(it.Qty)
	}
	return items, total, nil
}

// Create stores a new order with status created and enqueues orders.created,
// in one transaction.
func (s *Service) Create(ctx context.Context, n NewOrder) (*Order, error) {
	items, total, err := s.validate(&n)
	if err != nil {
		return nil, err
	}
	id, err := uuid.NewV7()
	if err != nil {
		return nil, fmt.Errorf("creating an order id: %w", err)
	}
	itemsJSON, err := json.Marshal(items)
	if err != nil {
		return nil, fmt.Errorf("encoding the items of order %s: %w", id, err)
	}
	var (
		o    *Order
		refs []EventRef
	)
	err = s.db.inTx(ctx, func(tx storeTx) error {
		var err error
		o, err = tx.insert(ctx, newRow{id: id, customer: n.Customer, items: itemsJSON, totalCents: total, currency: n.Currency})
		if err != nil {
			return err
		}
		created, err := s.event(TopicOrderCreated, o, orderPayload{
			OrderID: o.ID, Customer: o.Customer, Items: o.Items, Total: o.Total, Currency: o.Currency, CreatedAt: &o.CreatedAt,
		})
		if err != nil {
			return err
		}
		refs, err = enqueue(ctx, tx, created)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("creating order %s: %w", id, err)
	}
	s.committed(o.ID, refs)
	return o, nil
}

// Pay marks an order paid and enqueues orders.paid and email.order_paid, in
// one transaction that first locks the order row. It returns ErrNotFound
// or ErrAlreadyPaid (changing nothing) when it cannot pay the order.
func (s *Service) Pay(ctx context.Context, id string) (*Order, error) {
	oid, err := uuid.Parse(id)
	if err != nil {
		return nil, ErrNotFound
	}
	var (
		o    *Order
		refs []EventRef
	)
	err = s.db.inTx(ctx, func(tx storeTx) error {
		status, err := tx.lockStatus(ctx, oid)
		switch {
		case err != nil:
			return err
		case status == StatusPaid:
			return ErrAlreadyPaid
		}
		if o, err = tx.markPaid(ctx, oid); err != nil {
			return err
		}
		paid, err := s.event(TopicOrderPaid, o, orderPayload{
			OrderID: o.ID, Customer: o.Customer, Items: o.Items, Total: o.Total, Currency: o.Currency, PaidAt: o.PaidAt,
		})
		if err != nil {
			return err
		}
		mailEvent, err := s.event(TopicEmailPaid, o, emailPayload{
			Subject: fmt.Sprintf("Payment received for order %s", o.ID), Template: "order_paid",
			OrderID: o.ID, Customer: o.Customer, Items: o.Items, Total: o.Total, Currency: o.Currency,
		})
		if err != nil {
			return err
		}
		refs, err = enqueue(ctx, tx, paid, mailEvent)
		return err
	})
	switch {
	case errors.Is(err, ErrNotFound) || errors.Is(err, ErrAlreadyPaid):
		return nil, err
	case err != nil:
		return nil, fmt.Errorf("paying order %s: %w", oid, err)
	}
	s.committed(o.ID, refs)
	return o, nil
}

// Get returns one order, or ErrNotFound.
func (s *Service) Get(ctx context.Context, id string) (*Order, error) {
	oid, err := uuid.Parse(id)
	if err != nil {
		return nil, ErrNotFound
	}
	o, err := s.db.get(ctx, oid)
	if errors.Is(err, ErrNotFound) {
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("reading order %s: %w", oid, err)
	}
	return o, nil
}

// orderPayload is the payload of orders.created and orders.paid.
type orderPayload struct {
	OrderID   string      `json:"order_id"`
	Customer  Customer    `json:"customer"`
	Items     []Item      `json:"items"`
	Total     json.Number `json:"total"`
	Currency  string      `json:"currency"`
	CreatedAt *time.Time  `json:"created_at,omitempty"`
	PaidAt    *time.Time  `json:"paid_at,omitempty"`
}

// emailPayload is the payload of email.order_paid, which the email sink
// renders with the order_paid templates (to_field customer.email).
type emailPayload struct {
	Subject  string      `json:"subject"`
	Template string      `json:"template"`
	OrderID  string      `json:"order_id"`
	Customer Customer    `json:"customer"`
	Items    []Item      `json:"items"`
	Total    json.Number `json:"total"`
	Currency string      `json:"currency"`
}

// event builds an event about order o.
func (s *Service) event(topic string, o *Order, payload any) (outbox.Event, error) {
	e, err := outbox.JSON(topic, payload)
	if err != nil {
		return e, fmt.Errorf("encoding the %s event of order %s: %w", topic, o.ID, err)
	}
	id, err := uuid.NewV7()
	if err != nil {
		return e, fmt.Errorf("creating an event id: %w", err)
	}
	e.ID, e.Key, e.Headers = id, o.ID, s.cfg.EventHeaders
	return e, nil
}

// enqueue writes events in tx and names them for OnCommit.
func enqueue(ctx context.Context, tx storeTx, events ...outbox.Event) ([]EventRef, error) {
	ids, err := tx.enqueue(ctx, events)
	if err != nil {
		return nil, fmt.Errorf("enqueueing events: %w", err)
	}
	refs := make([]EventRef, len(ids))
	for i, id := range ids {
		refs[i] = EventRef{ID: id, Topic: events[i].Topic}
	}
	return refs, nil
}

// committed tells OnCommit about a committed transaction.
func (s *Service) committed(orderID string, events []EventRef) {
	if s.cfg.OnCommit != nil {
		s.cfg.OnCommit(Commit{OrderID: orderID, At: time.Now(), Events: events})
	}
}

// scanner is the Scan of a row, as pgx and database/sql both have it.
type scanner interface {
	Scan(dest ...any) error
}

// scanOrder reads the columns each store's orderColumns name, in order,
// the items as a JSON array of storedItem.
func scanOrder(row scanner) (*Order, error) {
	var (
		o      Order
		items  []byte
		stored []storedItem
		total  int64
		paidAt *time.Time
	)
	if err := row.Scan(&o.ID, &o.Customer.Name, &o.Customer.Email, &items, &total, &o.Currency, &o.Status, &o.CreatedAt, &paidAt); err != nil {
		return nil, err
	}
	if err := json.Unmarshal(items, &stored); err != nil {
		return nil, fmt.Errorf("decoding the items of order %s: %w", o.ID, err)
	}
	o.Items = make([]Item, len(stored))
	for i, it := range stored {
		o.Items[i] = Item{Name: it.Name, Qty: it.Qty, Price: formatCents(it.PriceCents)}
	}
	o.Total = formatCents(total)
	o.PaidAt = paidAt
	return &o, nil
}
