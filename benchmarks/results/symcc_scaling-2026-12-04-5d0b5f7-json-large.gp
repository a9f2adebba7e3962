set terminal pngcairo size 1000,600
set output '/work/main/benchmarks/results/symcc_scaling-2026-12-04-5d0b5f7-json-large.png'
$d0 << EOD
0.00 171
4.34 197
4.35 210
4.36 213
4.37 214
4.38 223
4.39 225
38.12 226
120.00 226
EOD
$d1 << EOD
0.00 171
3.68 199
3.69 211
3.70 219
3.71 225
13.74 226
18.01 227
20.41 228
57.27 231
120.00 231
EOD
$d2 << EOD
0.00 0
0.01 171
4.85 179
4.86 186
4.87 191
4.88 194
4.90 199
4.91 203
4.92 208
4.95 210
5.03 211
5.05 213
5.06 214
5.16 215
5.17 217
5.18 218
5.19 219
5.21 220
5.23 223
5.25 225
15.38 226
17.19 227
25.88 230
68.10 232
120.00 232
EOD
$d3 << EOD
0.00 0
0.64 171
4.92 203
4.93 210
4.94 214
4.95 219
4.96 225
6.46 226
10.92 227
12.59 230
21.48 232
63.00 233
120.00 233
EOD
$d4 << EOD
0.00 0
1.00 171
6.40 199
6.41 210
6.42 213
6.43 218
6.44 225
7.72 226
11.33 227
12.79 230
23.80 232
55.38 233
73.45 234
74.77 235
107.52 236
120.00 236
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
