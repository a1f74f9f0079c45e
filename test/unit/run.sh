#!/bin/sh
# Runs every unit test binary given and prints the total as "N passed, N failed".
total_p=0; total_f=0; rc=0
for bin in "$@"; do
	out=$("$bin") || rc=1
	echo "$out"
	line=$(echo "$out" | tail -n 1)
	p=$(echo "$line" | sed -n 's/.* \([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed$/\1/p')
	f=$(echo "$line" | sed -n 's/.* \([0-9][0-9]*\) passed, \([0-9][0-9]*\) failed$/\2/p')
	[ -n "$p" ] || { echo "unit: $bin printed no summary"; p=0; f=1; rc=1; }
	total_p=$((total_p + p)); total_f=$((total_f + f))
done
echo "$total_p passed, $total_f failed"
exit $rc
