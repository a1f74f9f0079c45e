-- parity row tls-large: one reply of 100 rows of 1,000 bytes (about 100 kB) per transaction
select repeat('x', 1000) from generate_series(1, 100);
