set terminal pngcairo size 1000,600
set output '/work/main/benchmarks/results/symcc_scaling-2026-12-04-99b7692-json-large.png'
$d0 << EOD
0.00 171
3.83 179
3.84 210
3.85 214
3.86 224
3.87 225
33.17 226
93.92 227
112.15 228
120.00 228
EOD
$d1 << EOD
0.00 171
3.23 199
3.24 210
3.25 214
3.26 219
3.27 225
13.30 226
17.53 227
19.37 228
47.31 231
120.00 231
EOD
$d2 << EOD
0.00 0
0.01 171
3.49 181
3.50 188
3.51 194
3.53 199
3.54 201
3.55 208
3.58 210
3.65 211
3.67 213
3.68 214
3.76 215
3.77 218
3.78 219
3.80 220
3.82 223
3.83 224
3.84 225
13.95 226
15.38 227
21.91 230
120.00 230
EOD
$d3 << EOD
0.00 0
0.48 171
4.14 208
4.15 214
4.16 225
5.63 226
10.77 227
11.24 230
22.21 232
62.34 233
120.00 233
EOD
$d4 << EOD
0.00 0
0.83 171
4.69 201
4.70 210
4.71 221
4.72 225
10.13 226
13.30 229
26.55 231
62.66 232
66.95 233
80.62 234
115.13 235
120.00 235
EOD
set title 'symcc\_scaling: json/large, 120 s each (edges vs seconds since launch)'
set xlabel 'seconds'
set ylabel 'AFL edges (ForkserverProbe)'
set key bottom right
set xrange [0:120]
set yrange [153:*]
set grid
plot $d0 with steps lw 1.5 title 'bare', \
     $d1 with steps lw 1.5 title 'bare+pruning', \
     $d2 with steps lw 3 title 'helper', \
     $d3 with steps lw 1.5 title 'previous', \
     $d4 with steps lw 3 title 'this'
