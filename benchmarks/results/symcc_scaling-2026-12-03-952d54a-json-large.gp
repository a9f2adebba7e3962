set terminal pngcairo size 1000,600
set output '/work/main/benchmarks/results/symcc_scaling-2026-12-03-952d54a-json-large.png'
$d0 << EOD
0.00 171
3.23 210
3.24 218
3.25 225
13.28 227
30.60 228
96.49 229
115.52 230
120.00 230
EOD
$d1 << EOD
0.00 171
3.68 210
3.69 219
3.70 225
17.40 226
19.01 227
25.40 229
42.66 232
114.37 233
115.29 234
120.00 234
EOD
$d2 << EOD
0.00 0
0.01 171
3.79 185
3.80 192
3.81 194
3.82 199
3.83 203
3.84 208
3.86 210
3.92 211
3.93 213
3.94 214
4.01 215
4.02 218
4.03 219
4.05 222
4.06 224
4.07 225
15.47 226
21.70 229
52.14 231
120.00 231
EOD
$d3 << EOD
0.00 0
0.48 171
5.22 208
5.23 214
5.24 225
7.25 226
13.86 229
31.84 231
120.00 231
EOD
$d4 << EOD
0.00 0
0.63 171
4.36 211
4.37 225
5.73 226
11.25 229
16.59 231
48.98 232
70.81 233
90.16 234
120.00 234
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
