"""Route handlers: decode, call one domain function, encode."""
