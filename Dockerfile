# Herald's images, built from the repository root:
#
#   docker build -t herald/relay .                          # the relay (default target)
#   docker build --target orders -t herald/orders .         # the orders example service
#   docker build --target consumer -t herald/consumer .     # the example's consumer
#
# Static binaries (CGO_ENABLED=0) on distroless, running as the nonroot user.
# The relay image holds no configuration: mount it at /etc/herald/relay.yaml
# (docker-compose.yml mounts examples/orders/relay.yaml).

FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/relay ./cmd/relay
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/orders ./examples/orders
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/consumer ./examples/orders/consumer

FROM gcr.io/distroless/static-debian12:nonroot AS orders
COPY --from=build /out/orders /orders
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/orders"]

FROM gcr.io/distroless/static-debian12:nonroot AS consumer
COPY --from=build /out/consumer /consumer
USER nonroot:nonroot
EXPOSE 8090
ENTRYPOINT ["/consumer"]

FROM gcr.io/distroless/static-debian12:nonroot AS relay
COPY --from=build /out/relay /relay
USER nonroot:nonroot
ENTRYPOINT ["/relay"]
CMD ["run", "--config", "/etc/herald/relay.yaml"]
