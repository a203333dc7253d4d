# syntax=docker/dockerfile:1
# Build: docker build -t balancer:0.1.0 .   Load into kind: kind load docker-image balancer:0.1.0

FROM rust:1.89-bookworm AS build
WORKDIR /src
# Dependencies first, so source edits do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir src benches \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && echo 'fn main() {}' > benches/admission.rs \
 && cargo build --release --locked \
 && rm -rf src benches
COPY src ./src
COPY benches ./benches
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin balancer

# glibc-matched (bookworm) distroless runtime, no shell, non-root.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/balancer /balancer
USER 65532:65532
EXPOSE 9443 8080
ENTRYPOINT ["/balancer", "run"]
