# cmake -DOUT=file -DLIST=listfile -P ConcatFiles.cmake: concatenates the files named (one per
# line) in LIST into OUT, each followed by a newline.
file(STRINGS "${LIST}" files)
file(WRITE "${OUT}.tmp" "")
foreach(f IN LISTS files)
  file(READ "${f}" content)
  file(APPEND "${OUT}.tmp" "${content}\n")
endforeach()
file(RENAME "${OUT}.tmp" "${OUT}")
