set terminal pngcairo size 1000,600
set output '/work/main/benchmarks/results/symcc_scaling-2026-12-05-0163fe2-json-large.png'
$d0 << EOD
0.00 171
3.38 208
3.39 214
3.40 219
3.41 225
13.46 227
31.93 228
94.37 229
113.57 230
120.00 230
EOD
$d1 << EOD
0.00 171
3.24 199
3.25 210
3.26 214
3.27 219
3.28 225
17.49 226
19.62 227
50.32 230
120.00 230
EOD
$d2 << EOD
0.00 0
0.01 171
3.74 179
3.75 188
3.76 192
3.77 194
3.79 201
3.80 207
3.81 208
3.83 210
3.91 211
3.93 214
4.03 215
4.04 218
4.05 219
4.07 220
4.09 223
4.10 224
4.11 225
16.04 226
23.91 229
120.00 229
EOD
$d3 << EOD
0.00 0
0.49 171
4.15 172
4.16 208
4.17 214
4.18 225
5.69 226
10.76 227
11.50 230
22.54 232
53.06 233
120.00 233
EOD
$d4 << EOD
0.00 0
0.70 171
4.05 172
4.06 208
4.07 214
4.08 225
8.13 226
11.86 229
24.95 231
47.96 232
58.52 233
73.78 234
79.49 235
110.93 236
111.05 237
120.00 237
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
